"""Benchmarks that print numbers: ``nmt bench train | decode`` (``attention``: nmt.bench_attention).

Each prints a readable table and, last, a one-line JSON summary for comparing commits.
Speeds are wall-clock on this machine; compare them as ratios measured in one run.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from nmt.config import Config
from nmt.config_checks import check_training_config
from nmt.data.batching import Batch, PairDataset, decoding_loader
from nmt.data.module import TranslationDataModule, prepare_data
from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.engines import check_engine_options
from nmt.errors import Stopped
from nmt.evaluate import split_pairs
from nmt.files import refuse_export
from nmt.memory import peak_memory_mb
from nmt.metrics import score_corpus
from nmt.models import build_model, scorer_of
from nmt.precision import autocast_dtype
from nmt.provenance import device_name
from nmt.search import max_output_lengths, restrict
from nmt.trainer import benchmark_trainer, training_precision
from nmt.training import TranslationModule, check_batches_per_process
from nmt.translator import Translator


def matmul_peak_gflops(dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                       n: int | None = None, repeats: int = 10) -> float:
    """Achieved GFLOP/s of an n x n matmul in ``dtype``: the reference for utilisation. By
    default n = 8192 on a GPU, which a 2048 product leaves partly idle, and on a CPU
    ``cpu_peak_size``: 2048 for the types it has kernels for."""
    n = n or (8192 if torch.device(device).type == "cuda" else cpu_peak_size(dtype))
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    a @ b  # warm-up
    sync = torch.cuda.synchronize if a.is_cuda else lambda: None
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


def cpu_peak_size(dtype: torch.dtype, largest: int = 2048, budget_s: float = 0.5) -> int:
    """The product size the CPU's peak is measured at: ``largest``, or, for a type the CPU
    multiplies slowly (fp16 without fp16 kernels: 1-3 GFLOP/s on an AMD EPYC Zen 5, minutes
    for ten 2048 products), the size whose product takes about ``budget_s``: doubling from
    256 while the next size (8x the work) would stay within it."""
    n = 256
    while n < largest:
        a = torch.randn(n, n).to(dtype)
        a @ a  # kernels warmed up
        start = time.perf_counter()
        a @ a
        if 8 * (time.perf_counter() - start) > budget_s:
            break
        n *= 2
    return n


def forward_flops(model: torch.nn.Module, src: Tensor, tgt_in: Tensor) -> int:
    """Forward FLOPs of ``model`` on a padded batch, src (B, S) and tgt_in (B, T): the family's
    own analytic count (``forward_flops``) where it has one, else torch's count of a forward
    pass, which a new family need not write. The two agree on the shipped families but for the
    additive scorers' elementwise (T, S, A) work, which torch's counter, counting matmuls, omits."""
    if hasattr(model, "forward_flops"):
        return model.forward_flops(src, tgt_in)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(src, src != PAD, tgt_in)
    return counter.get_total_flops()


class StepTimer(L.Callback):
    """Times optimizer steps after ``warmup`` steps and counts their tokens and FLOPs."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.seconds = self.tgt_tokens = self.src_tokens = self.flops = 0.0
        self.steps = 0

    @staticmethod
    def _clock(module: L.LightningModule) -> float:
        """The time once queued device work is done: CUDA kernels run asynchronously, so
        reading the clock without waiting would time only their launch."""
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        return time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch: Batch, batch_idx: int) -> None:
        self._steps_done = trainer.global_step  # this batch belongs to the next step
        self._start = self._clock(module)

    def on_train_batch_end(self, trainer, module, outputs, batch: Batch, batch_idx: int) -> None:
        if self._steps_done < self.warmup:
            return
        self.seconds += self._clock(module) - self._start
        # with trainer.accumulate_grad_batches, a group's last batch takes the step
        self.steps += trainer.global_step > self._steps_done
        self.tgt_tokens += int((batch.tgt_out != PAD).sum())
        self.src_tokens += int((batch.src != PAD).sum())
        self.flops += 3 * forward_flops(module.model, batch.src, batch.tgt_in)  # fwd + 2x bwd


def significant(value: float, digits: int = 3) -> float:
    """``value`` to ``digits`` significant digits: a tiny model's MFU reads 0.0004, not 0."""
    return float(f"{value:.{digits}g}")


class FitStopped(logging.Filter):
    """Drops Lightning's "`Trainer.fit` stopped: `max_steps=N` reached.": the bench's own end
    at the steps it asked for, which stood among its results (and among
    scripts/bench_plain_loop.py's) as if it said something about them; Lightning's other
    lines pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("`Trainer.fit` stopped:")


FIT_STOPPED = FitStopped()  # one instance: adding it again to a logger adds nothing


def bench_train(config: Config, steps: int = 30, warmup: int = 5) -> dict:
    """Tokens/s and FLOP utilisation of ``steps`` Lightning training steps after warm-up."""
    check_training_config(config)  # the options nmt train refuses, refused here as there
    L.seed_everything(config.seed, verbose=False)
    data = prepare_data(config.data)
    model = build_model(config.model, len(data.tokenizer))
    module = TranslationModule(model, data.tokenizer, config.optim, config.decoding, [], config.seed)
    timer = StepTimer(warmup)
    precision = training_precision(config)
    trainer = benchmark_trainer(config, warmup + steps, [timer], precision)
    datamodule = TranslationDataModule(data, config.data, config.seed, model.max_positions)
    check_batches_per_process(datamodule, config, 1)  # none at all: as nmt train says it
    # Lightning's console lines come through its rank-zero logger (Python's logging)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(FIT_STOPPED)
    try:
        trainer.fit(module, datamodule=datamodule)
    except SIGTERMException:  # Lightning's end of a SIGTERM, a bare SystemExit: exit status 0
        raise Stopped(signal.SIGTERM) from None  # as any command stopped so: 143, one line
    device = trainer.strategy.root_device
    peak = matmul_peak_gflops(torch.float32, device)
    # Under bf16/fp16 the matmuls run in that type: utilisation against its peak too.
    dtype = autocast_dtype(precision)
    precision_peak = matmul_peak_gflops(dtype, device) if dtype else peak
    achieved = timer.flops / timer.seconds / 1e9
    return {
        "bench": "train",
        "model": config.model["family"],
        "attention": scorer_of(config.model),  # the family's default where the config names none
        "steps": timer.steps,
        "tgt_tok_per_s": round(timer.tgt_tokens / timer.seconds, 1),
        "src_tok_per_s": round(timer.src_tokens / timer.seconds, 1),
        "sec_per_step": round(timer.seconds / timer.steps, 4),
        "tgt_tokens_per_step": round(timer.tgt_tokens / timer.steps, 1),
        "train_gflop_per_tgt_token": round(timer.flops / timer.tgt_tokens / 1e9, 4),
        "achieved_gflops": round(achieved, 1),
        # MFU against the peak of the precision the matmuls ran in (at most 1), and against
        # fp32's, which under bf16 can read above 1: how far past fp32's ceiling bf16 took it
        "precision_peak_gflops": round(precision_peak, 1),
        "mfu": significant(achieved / precision_peak),
        "fp32_peak_gflops": round(peak, 1),
        "fp32_peak_utilisation": significant(achieved / peak),
        "peak_rss_mb": round(peak_memory_mb(), 1),
        "threads": torch.get_num_threads(),
        "device": device_name(device),  # where it trained (compare --cost tables it)
        "precision": trainer.precision,
        "precision_reason": precision.reason,
    }


@torch.no_grad()
def greedy_recompute(model, src: torch.Tensor, src_mask: torch.Tensor, max_len_ratio: float) -> int:
    """Greedy decoding that re-runs the full decoder on the whole prefix at every step, the
    baseline that incremental decoding (``decode_step``) avoids. Returns tokens generated."""
    max_lens = max_output_lengths(src_mask, max_len_ratio, model.max_positions)
    prefix = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for step in range(int(max_lens.max())):
        log_probs = model(src, src_mask, prefix)[:, -1].log_softmax(-1)  # (B, V)
        next_token = restrict(log_probs, step >= max_lens - 1).argmax(-1)
        prefix = torch.cat([prefix, next_token.unsqueeze(1)], dim=1)
        done |= next_token == EOS
        if done.all():
            break
    return int(prefix.size(1) - 1) * src.size(0)


WARMUP_SENTENCES = 16


def _decode_rows(settings: list[tuple[str, object, int]], corpus: dict, repeat: int) -> list[dict]:
    """Time every (engine, translator, beam) over the split's sources, ``repeat``
    rounds in turn, and keep each setting's fastest pass: on a shared machine the same pass
    varies by up to 1.6x, and taking turns exposes the settings to the same noise. Each gets
    an untimed pass over a few sentences first (first calls pay for allocation and thread
    start-up). BLEU is of what it wrote: a faster setting must not cost quality."""
    sources = corpus["src"]
    for _, decoder, beam in settings:
        decoder.translate(sources[:WARMUP_SENTENCES], beam_size=beam)
    passes: list[list[float]] = [[] for _ in settings]
    outputs: list[list] = [[] for _ in settings]  # each setting's translations (last pass)
    for _ in range(repeat):
        for times, output, (_, decoder, beam) in zip(passes, outputs, settings):
            start = time.perf_counter()
            results = decoder.translate(sources, beam_size=beam)
            times.append(time.perf_counter() - start)
            output[:] = [r[0] for r in results]
    return [_decode_row(engine, decoder, beam, times, output, corpus)
            for times, output, (engine, decoder, beam) in zip(passes, outputs, settings)]


def _decode_row(engine: str, translator, beam: int, passes: list[float], results: list,
                corpus: dict) -> dict:
    """One row of ``bench decode``: speed of the fastest of the timed passes, and the BLEU
    of the output."""
    seconds, tokens = min(passes), sum(len(r.pieces) + 1 for r in results)  # + EOS
    precision = "float32" if engine == "ctranslate2" else translator.precision.precision
    return {"engine": engine, "precision": precision,
            "mode": f"beam{beam}" if beam > 1 else "greedy", "beam": beam,
            "seconds": round(seconds, 3), "slowest_pass": round(max(passes), 3),
            "sent_per_s": round(len(corpus["src"]) / seconds, 1),
            "tok_per_s": round(tokens / seconds, 1),
            "avg_output_len": round(tokens / len(corpus["src"]), 2),
            "bleu": round(score_corpus([r.text for r in results], corpus["tgt"])["bleu"], 2)}


def _recompute_row(translator: Translator, sources: list[str]) -> dict:
    """Greedy without the incremental state (the whole prefix every step)."""
    loader = decoding_loader(PairDataset(translator.encode_lines(sources)),
                             translator.config.data.eval_max_tokens)
    start = time.perf_counter()
    for batch in loader:
        with translator.autocast_context():
            greedy_recompute(translator.model, batch.src.to(translator.device),
                             batch.src_mask.to(translator.device),
                             translator.config.decoding.max_len_ratio)
    seconds = time.perf_counter() - start
    return {"engine": "torch", "precision": translator.precision.precision,
            "mode": "greedy_recompute", "beam": 1,
            "seconds": round(seconds, 3), "sent_per_s": round(len(sources) / seconds, 1)}


def _speed_ratios(rows: list[dict]) -> dict:
    """Time ratios of the rows (all decode the same sentences): each mode's cost against
    greedy, and the speed-up of each other (engine, precision) over torch at the first
    precision asked for, mode by mode: a mode's first torch row (auto may resolve to
    another precision at each beam)."""
    base: dict[str, dict] = {}
    for r in rows:
        if r["engine"] == "torch":
            base.setdefault(r["mode"], r)
    ratios = {}
    if "greedy" in base:
        ratios["beam_cost_vs_greedy"] = {m: round(r["seconds"] / base["greedy"]["seconds"], 2)
                                         for m, r in base.items()}
    for r in rows:
        if r["mode"] in base and r is not base[r["mode"]]:
            key = f"{r['engine']}_{r['precision']}_speedup"
            ratios.setdefault(key, {})[r["mode"]] = round(base[r["mode"]]["seconds"] / r["seconds"], 2)
    return ratios


def _torch_decoders(translator: Translator, precisions: tuple[str, ...], beams: list[int],
                    sentences: int | None) -> dict[int, list[Translator]]:
    """At each beam, a translator per precision that ``precisions`` resolve to there (auto may
    be 32-true, and is probed at that beam for ``sentences`` decoded together, as translate
    --beam probes it), ``precisions[0]``'s first. At the first beam that one is
    ``translator``, resolved once: auto probed again (its answer is not cached on a busy
    machine) could choose otherwise."""
    model, tokenizer, config = translator.model, translator.tokenizer, translator.config
    decoders = {}
    for beam in beams:
        first = translator if beam == beams[0] else Translator(model, tokenizer, config,
                                                                precisions[0], sentences, beam)
        chosen = {first.precision.precision: first}
        for p in precisions[1:]:
            decoder = Translator(model, tokenizer, config, p, sentences, beam)
            chosen.setdefault(decoder.precision.precision, decoder)
        decoders[beam] = list(chosen.values())
    return decoders


def count_rows(model) -> list[int]:
    """Wrap ``model.decode_step`` to count the decoder rows it is given: [total] (rows decoded is
    what beam search's cost follows; ``scripts/bench_beam_pruning.py`` reports it)."""
    rows, step = [0], model.decode_step

    def counting(prev, *args):
        rows[0] += len(prev)
        return step(prev, *args)

    model.decode_step = counting
    return rows


def bench_decode(run_dir: str, beams: list[int], split: str = "test", limit: int | None = None,
                 recompute: bool = True, engines: tuple[str, ...] = ("torch",),
                 precisions: tuple[str, ...] = ("auto",), repeat: int = 3,
                 ensemble: Sequence[str] = ()) -> dict:
    """Sentences/s, generated tokens/s and BLEU of greedy and beam search over a corpus split,
    for each engine (torch: at each decoding precision; ctranslate2: the run exported in
    float32) at each beam size; the fastest of ``repeat`` passes taken in turn. With
    ``ensemble``, the torch engine decodes with those runs too (``Translator.from_run_dir``)."""
    # a beam or engine named twice: one row (it was timed twice, the ratios taking the last)
    beams, engines = list(dict.fromkeys(beams)), tuple(dict.fromkeys(engines))
    for engine in engines:
        check_engine_options(engine, None, None, ensemble)
    refuse_export(run_dir, "bench decode takes a training run (--engine ctranslate2 exports "
                           "it in float32)")
    # auto decides for the sentences decoded together: --limit of them at most; CTranslate2
    # alone decodes nothing in torch, whose translator then only reads the run
    precision = precisions[0] if "torch" in engines else "32-true"
    translator = Translator.from_run_dir(run_dir, precision=precision, sentences=limit,
                                         beam=beams[0], ensemble=ensemble)
    sources, references = split_pairs(translator.config.data, split)
    corpus = {"src": sources[:limit], "tgt": references[:limit]}
    torch_decoders = _torch_decoders(translator, precisions, beams, limit) \
        if "torch" in engines else {}
    with tempfile.TemporaryDirectory() as tmp:
        ct2 = None
        if "ctranslate2" in engines:
            from nmt.ctranslate2_translator import CTranslate2Translator
            from nmt.export import export_ctranslate2

            ct2 = CTranslate2Translator(export_ctranslate2(run_dir, Path(tmp) / "ct2"))
        settings = [(engine, decoder, beam) for beam in beams for engine in engines
                    for decoder in (torch_decoders[beam] if engine == "torch" else [ct2])]
        rows = _decode_rows(settings, corpus, repeat)
    if recompute and "torch" in engines:  # greedy: in the greedy rows' precision, where there are some
        rows.append(_recompute_row(torch_decoders.get(1, [translator])[0], corpus["src"]))
    return {"bench": "decode", "run": str(run_dir),
            "ensemble": [str(run) for run in ensemble],  # the runs, named as "run" is
            "split": split, "sentences": len(corpus["src"]),
            "passes": repeat, "prune_margin": translator.config.decoding.prune_margin,
            "rows": rows, "peak_rss_mb": round(peak_memory_mb(), 1),
            **_speed_ratios(rows)}
