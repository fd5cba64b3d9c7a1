"""``trainer.precision: auto``: pick the training precision by what is fast on this machine.

On CUDA the answer is known from the hardware: bf16 mixed precision where the GPU has native
bf16 (compute capability 8.0 or later), else fp16 mixed precision (Lightning adds the gradient
scaler). On a CPU it must be measured: bf16 matmuls run 2.7x faster than fp32 on an AMD EPYC
with AVX512-BF16 and ~3x on an Intel Xeon with AMX, but at half speed on an Intel Xeon with
AVX512-BF16 and no AMX, although both report bf16 support. So ``auto`` times the model's own
matmul shapes in fp32 and in bf16 (a few hundred milliseconds) and takes the faster. The
answer is cached per CPU model, torch version and shapes in ``~/.cache/nmt/precision.json``.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.config import DECODING_PRECISIONS
from nmt.errors import NMTError

CACHE = Path(os.environ.get("NMT_CACHE_DIR", Path.home() / ".cache" / "nmt")) / "precision.json"
BF16_MARGIN = 1.1  # bf16 must win by 10%: autocast's casts cost something the probe omits


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # a Lightning precision string, e.g. "bf16-mixed" or "32-true"
    reason: str


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_identity() -> str:
    """Model name, family/model numbers and the bf16 matmul flags: one Xeon name covers CPUs
    with and without AMX, so the name alone cannot key the cache."""
    info = _cpuinfo()
    flags = sorted(f for f in info.get("flags", "").split() if "bf16" in f or f.startswith("amx"))
    return f"{cpu_model()} family {info.get('cpu family')} model {info.get('model')} {flags}"


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` ({} where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def probe_shapes(model_cfg: dict, vocab_size: int, tokens: int = 512) -> list[tuple[int, int, int]]:
    """The (M, K, N) matmuls that dominate a training step of this model: a projection, the
    feed-forward (or recurrent) layer and the output layer, over ``tokens`` rows (a quarter of
    a batch keeps the probe short; oneDNN's speed ratio hardly changes with M)."""
    d = int(model_cfg.get("d_model") or model_cfg.get("hidden_size") or 512)
    ff = int(model_cfg.get("ff_dim") or 3 * d)  # RNN: the three GRU gates
    return [(tokens, d, d), (tokens, d, ff), (tokens, d, vocab_size)]


def _seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start


def time_matmuls(shapes: list[tuple[int, int, int]], rounds: int = 2) -> dict[str, float]:
    """Best-of-``rounds`` seconds for all ``shapes`` in fp32 and in bf16, the two measured in
    alternation so that a noisy neighbour slows both alike."""
    best = {"fp32": 0.0, "bf16": 0.0}
    for m, k, n in shapes:
        operands = {name: (torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype))
                    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
        times = {name: [] for name in operands}
        for _ in range(rounds + 1):  # the first round warms up oneDNN's kernels
            for name, (a, b) in operands.items():
                times[name].append(_seconds(a, b))
        for name in best:
            best[name] += min(times[name][1:])
    return best


def _cached(key: str) -> dict | None:
    try:
        return json.loads(CACHE.read_text()).get(key)
    except (OSError, ValueError):
        return None


def _store(key: str, value: dict) -> None:
    try:
        entries = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = value
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = CACHE.with_name(f".{CACHE.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, CACHE)
    except OSError:  # a read-only home: probe again next time
        pass


def has_native_bf16() -> bool:
    """Whether oneDNN has bf16 matmul kernels on this CPU (AVX512-BF16 or AMX)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def choose_cpu_precision(shapes: list[tuple[int, int, int]]) -> PrecisionChoice:
    """bf16-mixed if bf16 matmuls of ``shapes`` beat fp32 by ``BF16_MARGIN``, else 32-true."""
    cpu = cpu_model()
    if not has_native_bf16():
        return PrecisionChoice("32-true", f"no native bf16 matmuls on {cpu}")
    key = f"{cpu_identity()}|torch {torch.__version__}|threads {torch.get_num_threads()}|{shapes}"
    timing = _cached(key)
    source = "cached probe"
    if timing is None:
        timing, source = time_matmuls(shapes), "probe"
        _store(key, timing)
    speedup = timing["fp32"] / timing["bf16"]
    chosen = "bf16-mixed" if speedup >= BF16_MARGIN else "32-true"
    return PrecisionChoice(chosen, f"bf16 matmuls {speedup:.2f}x fp32 on {cpu} ({source})")


def resolve_precision(precision: str, shapes: list[tuple[int, int, int]] | None = None,
                      accelerator: str = "auto") -> PrecisionChoice:
    """The Lightning precision to train with; ``auto`` decides by hardware or measurement."""
    if precision != "auto":
        return PrecisionChoice(precision, "set in the config")
    if torch.cuda.is_available() and accelerator in ("auto", "cuda", "gpu"):
        major, minor = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
        if major >= 8:
            return PrecisionChoice("bf16-mixed", f"{name} (compute {major}.{minor}) has native bf16")
        return PrecisionChoice("16-mixed", f"{name} (compute {major}.{minor}) lacks native bf16; "
                                           "fp16 with a gradient scaler")
    return choose_cpu_precision(shapes or probe_shapes({}, 8000))


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}  # by Lightning's prefix


def autocast_dtype(choice: PrecisionChoice) -> torch.dtype | None:
    """The dtype autocast runs matmuls in under ``choice``; None for full precision."""
    return AUTOCAST_DTYPES.get(choice.precision.split("-")[0])


def decoding_precision(config, device_type: str, precision: str | None = None) -> PrecisionChoice:
    """The precision translate, evaluate and serve decode in: ``precision`` if given, else
    ``decoding.precision``. Its ``auto`` is decided on the decoding device as training's is (the
    same probe of the model's shapes), whatever precision the run trained in: a run trained in
    bf16 on one machine may be decoded on a CPU where bf16 is slow. On a 2-core Intel Xeon with
    AMX, bf16 decoding of a trained Transformer ran 1.13x (greedy) and 1.32x (beam 5) faster
    than fp32, test2016 BLEU +0.01 and -0.07 (README, Serving and export)."""
    precision = precision or config.decoding.precision
    if precision not in DECODING_PRECISIONS:
        raise NMTError(f"unknown decoding precision '{precision}'; choose from: "
                       f"{', '.join(DECODING_PRECISIONS)}")
    shapes = probe_shapes(config.model, config.data.vocab_size)
    return resolve_precision(precision, shapes, "cuda" if device_type == "cuda" else "cpu")


_announced: set[PrecisionChoice] = set()


def training_precision(config) -> PrecisionChoice:
    """``resolve_precision`` for a run's ``Config`` (its model's shapes), printed once per
    process so that the user sees what ``auto`` chose and why."""
    shapes = probe_shapes(config.model, config.data.vocab_size)
    choice = resolve_precision(config.trainer.precision, shapes, config.trainer.accelerator)
    if choice not in _announced:
        _announced.add(choice)
        print(f"precision: {choice.precision} ({choice.reason})", flush=True)
    return choice
