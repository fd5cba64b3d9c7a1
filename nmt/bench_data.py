"""``nmt bench data``: how the data path scales with the corpus.

It writes a synthetic corpus of N pairs (Multi30k training pairs, cycled, with the words of
each sentence shuffled, so SentencePiece and the lengths behave like real text; ``join`` K
pairs per line give WMT-like lengths, ~25 words a side for K = 2), then measures,
each stage in a fresh process:

* prepare: wall time and peak RSS of ``nmt prepare``;
* training start-up: seconds from process start to the first finished training step, and the
  training process's RSS once batches flow;
* throughput: the sampler (batches of one epoch per second), the loader (padded batches per
  second) and, next to them, the model's training steps per second.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import tempfile
import time
from pathlib import Path

import lightning as L

from nmt.config import Config, DataConfig, load_config
from nmt.config_checks import check_training_config
from nmt.data.corpus import local_files, read_pairs
from nmt.data.module import TranslationDataModule, prepare_data
from nmt.data.prepare import prepare
from nmt.errors import NMTError, stop_signals_deferred
from nmt.memory import peak_memory_mb, resident_memory_mb
from nmt.models import build_model
from nmt.trainer import benchmark_trainer
from nmt.training import TranslationModule, check_batches_per_process


def synthetic_corpus(folder: Path, pairs: int, join: int = 1, seed: int = 0) -> dict[str, list[str]]:
    """Write train.{de,en} (``pairs`` lines of ``join`` Multi30k pairs each) and val.{de,en}
    under ``folder``; returns {split: [source path, target path]}."""
    multi30k = local_files(DataConfig())
    if multi30k is None:
        raise SystemExit("nmt bench data needs data/multi30k (see README, Quickstart)")
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    files = {}
    for split, size in (("train", pairs), ("val", None)):
        src, tgt = [], []
        for s, t in read_pairs(multi30k[split]):
            src += s
            tgt += t
        out = [[], []]
        for i in range(size or len(src)):
            for side, lines in enumerate((src, tgt)):
                words = " ".join(lines[(i * join + j) % len(lines)] for j in range(join)).split()
                rng.shuffle(words)
                out[side].append(" ".join(words))
        paths = [folder / f"{split}.de", folder / f"{split}.en"]
        for path, lines in zip(paths, out):
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        files[split] = [str(p) for p in paths]
    return files


def _prepare_stage(config: Config, results) -> None:
    start = time.perf_counter()
    prepare(config.data)
    results.put({"prepare_s": round(time.perf_counter() - start, 1),
                 "prepare_peak_rss_mb": round(peak_memory_mb())})


class _FirstSteps(L.Callback):
    """Wall-clock time of the first finished optimizer step, RSS and step rate after it."""

    def __init__(self):
        self.first = self.last = None
        self.steps = 0

    def on_train_batch_end(self, trainer, *args) -> None:
        steps_seen = self.steps + (self.first is not None)
        if trainer.global_step == steps_seen:
            return  # inside a group of trainer.accumulate_grad_batches batches: no step yet
        now = time.time()
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now


def _train_stage(config: Config, steps: int, spawned_at: float, results) -> None:
    data = prepare_data(config.data)
    model = build_model(config.model, len(data.tokenizer))
    module = TranslationModule(model, data.tokenizer, config.optim, config.decoding, [], config.seed)
    probe = _FirstSteps()
    trainer = benchmark_trainer(config, steps + 1, [probe])
    datamodule = TranslationDataModule(data, config.data, config.seed, model.max_positions)
    check_batches_per_process(datamodule, config, 1)  # none at all: as nmt train says it
    trainer.fit(module, datamodule=datamodule)
    rss = resident_memory_mb()  # batches have flowed: the loader and the model are both in memory
    start = time.perf_counter()
    sampler_batches = sum(1 for _ in datamodule.sampler)
    sampler_s = time.perf_counter() - start
    loader = datamodule.train_dataloader()
    start, loaded = time.perf_counter(), 0
    for _ in loader:
        loaded += 1
        if time.perf_counter() - start > 5:
            break
    results.put({
        "first_step_s": round(probe.first - spawned_at, 1),
        "train_rss_mb": round(rss),
        "sampler_batches_per_s": round(sampler_batches / sampler_s),
        "loader_batches_per_s": round(loaded / (time.perf_counter() - start), 1),
        "model_steps_per_s": round(probe.steps / max(probe.last - probe.first, 1e-9), 2),
        "train_batches_per_epoch": len(datamodule.sampler),
    })


def _in_fresh_process(target, *args) -> dict:
    """``target(*args, results)`` in a new process; what it puts on ``results``. A process that
    dies first (its error is on stderr) is a one-line error, not a wait without end; one still
    running when this one is stopped (Ctrl-C, SIGTERM) is stopped with it."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_stage, args=(target, args, results))
    try:
        with stop_signals_deferred():  # a stop inside start() would leave the process unknown
            process.start()
        while True:
            try:
                out = results.get(timeout=1.0)
                break
            except queue.Empty:
                if not process.is_alive() and results.empty():  # it may have put, then ended
                    raise NMTError(f"the {target.__name__.strip('_')} process failed "
                                   f"(exit {process.exitcode}); its error is above") from None
    except BaseException:  # stopped meanwhile: not left running on alone, into a removed folder
        if process.pid is not None:  # started
            process.terminate()
            process.join()
        raise
    process.join()
    if "error" in out:
        raise NMTError(out["error"])
    return out


def _stage(target, args: tuple, results) -> None:
    """A stage in its process: its one-line error handed back as such (not a traceback)."""
    try:
        target(*args, results)
    except NMTError as err:
        results.put({"error": str(err)})


def bench_data(pairs: int, config_file: str, folder: Path, steps: int = 5, join: int = 1,
               overrides: list[str] = ()) -> dict:
    """Generate the corpus, prepare it, start training on it; one dict of numbers."""
    start = time.perf_counter()
    files = synthetic_corpus(folder / "corpus", pairs, join)
    generated = time.perf_counter() - start
    # The corpus is written anew (a new key: prepared again, as measured), so its prepared
    # folder goes at the end: one was left for each run, hundreds of MB for a large corpus
    with tempfile.TemporaryDirectory(prefix="data.", dir=folder) as data_dir:
        config = load_config(config_file, [
            f"data.train_files=[{','.join(files['train'])}]",
            f"data.val_files=[{','.join(files['val'])}]",
            f"data.data_dir={data_dir}", "trainer.enable_progress_bar=false", *overrides,
        ])
        check_training_config(config)  # what training refuses: now, not in a stage's process
        summary = {"bench": "data", "pairs": pairs, "join": join, "config": config_file,
                   "generate_s": round(generated, 1)}
        summary.update(_in_fresh_process(_prepare_stage, config))
        summary.update(_in_fresh_process(_train_stage, config, steps, time.time()))
    summary["loader_vs_model"] = round(summary["loader_batches_per_s"]
                                       / max(summary["model_steps_per_s"], 1e-9), 1)
    return summary
