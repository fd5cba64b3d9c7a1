"""``trainer.precision: auto``: pick the training precision by what is fast on this machine.

On CUDA training's answer is known from the hardware: bf16 mixed precision where the GPU has
native bf16 (compute capability 8.0 or later), else fp16 mixed precision (Lightning adds the
gradient scaler). On a CPU it must be measured: bf16 matmuls run 2.7x faster than fp32 on an AMD EPYC
with AVX512-BF16 and ~3x on an Intel Xeon with AMX, but at half speed on an Intel Xeon with
AVX512-BF16 and no AMX, although both report bf16 support. So ``auto`` times the model's own
matmul shapes in fp32 and in bf16 (a few hundred milliseconds) and takes the faster. The
answer is cached per CPU model, torch version and shapes in ``~/.cache/nmt/precision.json``.
Decoding's ``auto`` times the model's own decoding steps instead (``time_decoding``), on a GPU
too: at the few rows of a decoding step, matmul timings do not predict it, and a small model's
step on a GPU waits on kernel launches, which autocast's casts add to (on an H200 the default
Transformer decoded in bf16 at 0.72x its fp32 speed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.config import DECODING_PRECISIONS
from nmt.data.tokenizer import BOS, UNK
from nmt.errors import NMTError
from nmt.models import build_shape_model, check_model_config
from nmt.models.base import select_rows

CACHE = Path(os.environ.get("NMT_CACHE_DIR", Path.home() / ".cache" / "nmt")) / "precision.json"
BF16_MARGIN = 1.1  # bf16 must win by 10%: autocast's casts cost something the probe omits
# Rounds whose fp32 / bf16 ratios differ by more than this were disturbed (a busy machine):
# decoding uses their answer but does not cache it, so that one noisy start does not decide
# for good (training caches it: see choose_cpu_precision).
STEADY_RATIO = 1.5
TYPICAL_SOURCE_PIECES = 16  # a Multi30k source: ~15 pieces; sets the sentences of a batch


@dataclass(frozen=True)
class Machine:
    """Where a probe runs: ``name`` for the reason printed, ``identity`` to key its cached
    answers, and the mixed precision it is timed against fp32 in (``half``)."""
    name: str
    identity: str
    half: str = "bf16-mixed"

    @property
    def half_name(self) -> str:
        """The half type's name in timings and the cache: "bf16" or "fp16"."""
        return "bf16" if self.half == "bf16-mixed" else "fp16"


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # a Lightning precision string, e.g. "bf16-mixed" or "32-true"
    reason: str
    measured: bool = False  # by a probe just now (not the cache, config or hardware)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_identity() -> str:
    """Model name, family/model numbers and the bf16 matmul flags: one Xeon name covers CPUs
    with and without AMX, so the name alone cannot key the cache."""
    info = _cpuinfo()
    flags = sorted(f for f in info.get("flags", "").split() if "bf16" in f or f.startswith("amx"))
    return f"{cpu_model()} family {info.get('cpu family')} model {info.get('model')} {flags}"


def this_cpu() -> Machine:
    """This CPU, timed in bf16."""
    return Machine(cpu_model(), cpu_identity())


def this_gpu() -> Machine:
    """The current CUDA device, timed against fp32 in the precision it trains in
    (``gpu_precision``)."""
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    return Machine(name, f"{name} compute {major}.{minor}", gpu_precision().precision)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` ({} where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def probe_shapes(model_cfg: dict, vocab_size: int, tokens: int = 512) -> list[tuple[int, int, int]]:
    """The (M, K, N) matmuls that dominate a training step of this model, over ``tokens``
    rows (a quarter of a batch keeps the probe short; oneDNN's speed ratio hardly changes
    with M): a family names its own (``typical_matmuls``), from the config or its defaults;
    one that names none (a new family need not) is probed on its weight matrices' shapes."""
    cls, options = check_model_config(model_cfg)
    if hasattr(cls, "typical_matmuls"):
        return cls.typical_matmuls(options, vocab_size, tokens)
    model = build_shape_model(model_cfg, vocab_size)
    # a weight (N, K) multiplies (M, K) inputs; an embedding's (V, E) is the tied output layer's
    shapes = [(tokens, p.size(1), p.size(0)) for p in model.parameters() if p.dim() == 2]
    return list(dict.fromkeys(shapes))  # each shape once, in the model's order


def _seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start


def summarise_rounds(times: dict[str, list[float]]) -> dict:
    """Per type (fp32 and one half type: bf16 or fp16), the best of its rounds' seconds
    (``times[name][0]``, the warm-up, left out), and ``steady``: whether the rounds' fp32 /
    half ratios agree within STEADY_RATIO."""
    half = next(name for name in times if name != "fp32")
    ratios = [fp32 / other for fp32, other in zip(times["fp32"][1:], times[half][1:])]
    return {**{name: min(seconds[1:]) for name, seconds in times.items()},
            "steady": max(ratios) <= STEADY_RATIO * min(ratios)}


def time_matmuls(shapes: list[tuple[int, int, int]], rounds: int = 2) -> dict:
    """``summarise_rounds`` of ``rounds`` rounds of all ``shapes`` in fp32 and in bf16, each
    shape's two types measured in alternation so that a noisy neighbour slows both alike."""
    times = {"fp32": [0.0] * (rounds + 1), "bf16": [0.0] * (rounds + 1)}  # per round, all shapes
    # Its own generator: drawing from the global one would make a seeded run's initial weights
    # depend on whether this machine's answer was cached.
    draw = torch.Generator().manual_seed(0)
    for m, k, n in shapes:
        operands = {name: (torch.randn(m, k, dtype=dtype, generator=draw),
                           torch.randn(k, n, dtype=dtype, generator=draw))
                    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
        for r in range(rounds + 1):  # the first round warms up oneDNN's kernels
            for name, (a, b) in operands.items():
                times[name][r] += _seconds(a, b)
    return summarise_rounds(times)


def _entries() -> dict:
    """The cache's entries; none where it is missing, unreadable or not a JSON object."""
    try:
        entries = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _cached(key: str, half_name: str) -> dict | None:
    """The timing cached under ``key``; None where there is none, or where the entry holds no
    pair of positive seconds (fp32 and ``half_name``) as ``_store`` writes them, floats (a
    hand-edited or damaged cache: measured anew and replaced)."""
    timing = _entries().get(key)
    valid = isinstance(timing, dict) and all(
        type(timing.get(name)) is float and 0 < timing[name] < math.inf for name in ("fp32", half_name))
    return timing if valid else None


def _store(key: str, value: dict) -> bool:
    """Add ``value`` to the cache under ``key``: read, add, and rename a new file over it
    (readers see the old file or the new, whole), all under an exclusive lock on a file beside
    it, so that processes storing at once (nmt compare --jobs 2) do not each write what they
    read without the other's entry. Whether it was stored: where nothing can be written (a
    read-only home), nothing is, and the next run probes again."""
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        with open(CACHE.with_name(f"{CACHE.name}.lock"), "a") as lock:
            with contextlib.suppress(OSError):  # a file system without locks: unguarded
                fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
            entries = _entries()
            entries[key] = value
            tmp = CACHE.with_name(f".{CACHE.name}.{os.getpid()}")
            tmp.write_text(json.dumps(entries, indent=1))
            os.replace(tmp, CACHE)
    except OSError:
        return False
    return True


def has_native_bf16() -> bool:
    """Whether oneDNN has bf16 matmul kernels on this CPU (AVX512-BF16 or AMX)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def choose_cpu_precision(shapes: list[tuple[int, int, int]], leader: bool = True) -> PrecisionChoice:
    """bf16-mixed if bf16 matmuls of ``shapes`` beat fp32 by ``BF16_MARGIN``, else 32-true.
    Cached steady or not: DDP's other processes (not the ``leader``), started after the first
    chose, read its answer there as it is, and must train in the same precision. A disturbed
    answer decides that run alone: the next run's leader measures again."""
    return choose_by_probe(str(shapes), lambda: time_matmuls(shapes), "bf16 matmuls",
                           cache_unsteady=True, leader=leader)


def choose_by_probe(probe: str, measure: Callable[[], dict], what: str,
                    cache_unsteady: bool = False, leader: bool = True,
                    machine: Machine | None = None) -> PrecisionChoice:
    """The ``machine``'s half precision (default: this CPU's bf16-mixed) if ``measure()``
    (``summarise_rounds``: seconds in fp32 and in it) finds it faster by ``BF16_MARGIN``, else
    32-true. ``probe`` names what is measured; with the machine, torch version and threads (a
    speed ratio depends on them) it keys the cache, which keeps a measurement whose rounds
    disagreed (a busy machine) only with ``cache_unsteady``, and for followers: a ``leader``
    measures such an entry again. ``what`` names it in the reason; only a leader says on
    stderr that a probe runs (DDP's other processes stay quiet)."""
    if machine is None:
        if not has_native_bf16():
            return PrecisionChoice("32-true", f"no native bf16 matmuls on {cpu_model()}")
        machine = this_cpu()
    key = f"{machine.identity}|torch {torch.__version__}|threads {torch.get_num_threads()}|{probe}"
    timing = _cached(key, machine.half_name)
    if timing is not None and (timing.get("steady", True) or not leader):
        return _choice(timing, what, machine, "cached probe", measured=False)
    if leader:
        print(f"precision auto: timing {what} against fp32 (the answer is cached in {CACHE}; "
              "delete that file to measure again) ...", file=sys.stderr, flush=True)
    timing = measure()
    if not (timing["steady"] or cache_unsteady):
        source = "probe; not cached: its rounds disagreed, the machine is busy"
    elif not _store(key, timing):
        source = f"probe; not cached: {CACHE} cannot be written"
    elif not timing["steady"]:
        source = "probe; its rounds disagreed, the machine is busy: the next run measures again"
    else:
        source = "probe"
    return _choice(timing, what, machine, source, measured=True)


def _choice(timing: dict, what: str, machine: Machine, source: str,
            measured: bool) -> PrecisionChoice:
    """The machine's half precision where ``timing`` has it at least BF16_MARGIN times faster
    than fp32, else 32-true."""
    speedup = timing["fp32"] / timing[machine.half_name]
    chosen = machine.half if speedup >= BF16_MARGIN else "32-true"
    return PrecisionChoice(chosen, f"{what} {speedup:.2f}x fp32 on {machine.name} ({source})",
                           measured)


def gpu_precision() -> PrecisionChoice:
    """Training's precision on the current CUDA device, known from its hardware: bf16-mixed
    where it has native bf16 (compute capability 8.0 or later), else 16-mixed."""
    major, minor = torch.cuda.get_device_capability()
    where = f"{torch.cuda.get_device_name()} (compute {major}.{minor})"
    if major >= 8:
        return PrecisionChoice("bf16-mixed", f"{where} has native bf16")
    return PrecisionChoice("16-mixed", f"{where} lacks native bf16; fp16 with a gradient scaler")


def resolve_precision(precision: str, choose_on_cpu: Callable[[], PrecisionChoice],
                      accelerator: str = "auto",
                      choose_on_gpu: Callable[[], PrecisionChoice] = gpu_precision) -> PrecisionChoice:
    """The Lightning precision to run in; ``auto`` decides by ``choose_on_gpu`` on CUDA (by
    default the hardware) and by ``choose_on_cpu`` (a measurement) on a CPU."""
    if precision != "auto":
        return PrecisionChoice(precision, "set in the config")
    if torch.cuda.is_available() and accelerator in ("auto", "cuda", "gpu"):
        return choose_on_gpu()
    return choose_on_cpu()


# Lightning takes short names for precisions it names otherwise when it runs in them
# (``Trainer.precision``, which a run's segments record): one precision, two spellings
LIGHTNING_NAMES = {"bf16": "bf16-mixed", "16": "16-mixed", "32": "32-true", "64": "64-true"}


def lightning_name(precision: str) -> str:
    """``precision`` as Lightning names it when it runs in it: bf16 is bf16-mixed."""
    return LIGHTNING_NAMES.get(str(precision), str(precision))


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "16": torch.float16}  # by Lightning's prefix


def autocast_dtype(choice: PrecisionChoice) -> torch.dtype | None:
    """The dtype autocast runs matmuls in under ``choice``; None for full precision."""
    return AUTOCAST_DTYPES.get(choice.precision.split("-")[0])


PROBE_STEPS = 4  # decoding steps per timed round of ``time_decoding``


HALF_TYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # a Machine's half_name


def time_decoding(model: torch.nn.Module, sentences: int, beam: int, rounds: int = 2,
                  half: str = "bf16") -> dict:
    """``summarise_rounds`` of ``rounds`` rounds of the model's own encoder and first decoding
    steps over ``sentences`` sources with ``beam`` hypotheses each, on the model's device, in
    fp32 and in ``half`` (bf16 or fp16) autocast, in alternation. Each round has sources of a
    new length, as real decoding keeps meeting new shapes: bf16 kernels for a new shape cost
    more to create than fp32 ones."""
    device = next(model.parameters()).device
    expand = torch.arange(sentences, device=device).repeat_interleave(beam)  # sentence i -> its K rows

    def decode(length: int, dtype: torch.dtype | None) -> float:
        src = torch.full((sentences, length), UNK, device=device)  # content does not change the cost
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast(device.type, dtype, enabled=dtype is not None):
            memory = model.encode(src, torch.ones_like(src, dtype=torch.bool))
            first = torch.full((sentences,), BOS, device=device)
            log_probs, state, _ = model.decode_step(first, model.init_state(memory), memory)
            prev, state = log_probs.argmax(-1)[expand], select_rows(state, expand)
            for _ in range(PROBE_STEPS):
                log_probs, state, _ = model.decode_step(prev, state, memory)
                prev = log_probs.argmax(-1)
        if device.type == "cuda":  # the kernels queued must have run before the clock is read
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"fp32": [], half: []}
    for length in range(12, 12 + rounds + 1):  # the first round warms up
        for name, dtype in (("fp32", None), (half, HALF_TYPES[half])):
            times[name].append(decode(length, dtype))
    return summarise_rounds(times)


def decoding_precision(config, model: torch.nn.Module, device_type: str,
                       precision: str | None = None, sentences: int | None = None,
                       beam: int | None = None) -> PrecisionChoice:
    """The precision translate, evaluate and serve decode in: ``precision`` if given, else
    ``decoding.precision``. Its ``auto`` is decided on the decoding device, whatever precision
    the run trained in, by timing the model's own decoding steps for ``sentences`` sentences
    decoded together (at most, and by default, a batch of ``data.eval_max_tokens``) at
    ``beam``, the beam decoded at (default: the config's decoding.beam_size), each beam's
    answer cached apart.
    Matmul timings do not predict decoding, nor one beam another: on a 2-core Intel Xeon with
    AMX, bf16 matmuls of 160 rows ran 4x fp32, yet bf16 decoding of 32 sentences at beam 5 ran
    0.88x fp32 and at greedy 0.57x, while with 8,000-token batches beam 5 ran 1.5x (docs/usage.md,
    Load test)."""
    precision = precision or config.decoding.precision
    if precision not in DECODING_PRECISIONS:
        raise NMTError(f"unknown decoding precision '{precision}'; choose from: "
                       f"{', '.join(DECODING_PRECISIONS)}")
    batch = max(1, config.data.eval_max_tokens // TYPICAL_SOURCE_PIECES)
    sentences = min(sentences or batch, batch)
    beam = config.decoding.beam_size if beam is None else beam
    # every model option keys the answer but its dropout rates (decoding does not drop out)
    model_options = {key: value for key, value in config.model.items() if "dropout" not in key}
    probe = (f"decoding {json.dumps(model_options, sort_keys=True)} vocab {config.data.vocab_size} "
             f"{sentences}x{beam}")

    def choose(machine: Machine | None = None) -> PrecisionChoice:  # None: this CPU
        half = machine.half_name if machine else "bf16"
        return choose_by_probe(probe, lambda: time_decoding(model, sentences, beam, half=half),
                               f"{half} decoding of {sentences} sentence{'s' * (sentences != 1)} "
                               f"x beam {beam}", machine=machine)

    choice = resolve_precision(precision, choose, "cuda" if device_type == "cuda" else "cpu",
                               lambda: choose(this_gpu()))
    if choice.measured:  # what the wait was for; later runs read the cache quietly
        print(f"decoding precision: {choice.precision} ({choice.reason})", file=sys.stderr,
              flush=True)
    return choice
