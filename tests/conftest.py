"""Shared fixtures: a tiny synthetic translation task and small models of both families."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The suite asserts what holds on a CPU, CI's machine (batched decoding equal to one sentence at
# a time bit for bit, the precision probe, one-line errors); on a machine with a GPU it runs on
# that machine's CPU (its subprocesses too), before torch first looks for CUDA. What a GPU does
# is checked by the device scripts in docs/results/ (h100/, h200/).
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# The Hub is out of reach on CI's machines: a lookup waited for the network's timeouts (23 s in
# each of four tests) before the error the tests assert; offline, it fails at once, with the
# same one-line error. Read by huggingface_hub and datasets when first imported (below).
os.environ["HF_HUB_OFFLINE"] = "1"


def pin_to_this_workers_cores() -> None:
    """Under pytest-xdist (``-n N``), keep each worker and the processes it starts on its own
    share of the cores: most tests wait on one-threaded work (imports, subprocesses), which N
    workers overlap, but two workers' torch threads on the same cores slowed each other (2
    cores of a Zen 3: 24 minutes with one worker, 16.6 with two unpinned, 11.1 pinned)."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if count > 1 and len(cores) >= count:
        # gw0, gw1, ...; a worker started in place of one that died gets the next number
        worker = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw")) % count
        os.sched_setaffinity(0, cores[worker::count])


pin_to_this_workers_cores()

import torch  # noqa: E402

from nmt.data.batching import collate  # noqa: E402
from nmt.memory import usable_cpus  # noqa: E402
from nmt.models import build_model  # noqa: E402

torch.set_num_threads(min(2, usable_cpus()))

SYMBOLS = list(range(4, 14))  # ids 0-3 are PAD, UNK, BOS, EOS
REPO = Path(__file__).resolve().parent.parent
MULTI30K = REPO / "data" / "multi30k"

TINY = {
    "rnn": {"family": "rnn", "emb_dim": 32, "hidden_size": 64, "attention_dim": 64, "dropout": 0.0},
    "transformer": {"family": "transformer", "d_model": 64, "heads": 4, "ff_dim": 128,
                    "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0},
}


def tiny_model(family: str, attention: str, vocab: int = 14, seed: int = 0, **options):
    torch.manual_seed(seed)
    return build_model({**TINY[family], "attention": attention, **options}, vocab)


def reversal_batch(rng: random.Random, size: int, min_len: int = 3, max_len: int = 7):
    """A batch of the reversal task: target = source reversed."""
    items = []
    for i in range(size):
        src = [rng.choice(SYMBOLS) for _ in range(rng.randint(min_len, max_len))]
        items.append((i, src, src[::-1]))
    return collate(items)


@pytest.fixture
def toy_registries(monkeypatch):
    """tests.toys' scorer as "toy_cosine" in SCORERS and its family as "toy" in MODELS, for
    one test: what a researcher's one class and one registry entry give."""
    from nmt import attention, models

    from .toys import ToyFamily, ToyScorer

    monkeypatch.setitem(attention.SCORERS, "toy_cosine", ToyScorer)
    monkeypatch.setitem(models.MODELS, "toy", ToyFamily)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT as an interactive Python takes it (KeyboardInterrupt): a shell's background job
    (CI's ``nohup ... &``) starts with SIGINT ignored, and Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def random_batch():
    return reversal_batch(random.Random(0), 6)


def write_corpus(folder: Path, sizes=(("train", 300), ("val", 40), ("test", 30))) -> dict:
    """A small word-level parallel corpus (target = source words upper-cased, reversed),
    written as plain text files; returns {split: [source path, target path]}."""
    rng = random.Random(7)
    words = ["haus", "mann", "frau", "hund", "katze", "rot", "blau", "groß", "klein", "spielt",
             "läuft", "auf", "der", "die", "das", "im", "park", "wasser", "ball", "kind"]
    files = {}
    for split, n in sizes:
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(n)]
        tgt = [" ".join(reversed(line.upper().split())) for line in src]
        paths = [folder / f"{split}.src", folder / f"{split}.tgt"]
        paths[0].write_text("\n".join(src) + "\n", encoding="utf-8")
        paths[1].write_text("\n".join(tgt) + "\n", encoding="utf-8")
        files[split] = [str(p) for p in paths]
    return files


def tiny_train_args(files: dict, run_dir: Path, data_dir: Path, epochs: int = 1) -> list[str]:
    """Command-line arguments for a seconds-long training run on ``write_corpus`` files.
    It trains and decodes in 32-true, not auto: on a CPU with bf16 (an AMX Xeon, Zen 4/5) auto
    times bf16 against fp32 and prints two lines on stderr unless $NMT_CACHE_DIR/precision.json
    holds the answer, which depends on the tests run before (in this process or another xdist
    worker) and, for decoding, on the machine being quiet (a busy machine's answer is not
    cached). Tests of auto ask for it (test_precision.py; trainer.precision=auto here)."""
    return [
        "train", "--run-dir", str(run_dir), "--max-epochs", str(epochs),
        *tiny_options(files, data_dir), "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false", "trainer.accelerator=cpu",
        "trainer.precision=32-true", "decoding.precision=32-true",
    ]


def tiny_options(files: dict, data_dir: Path) -> list[str]:
    """Config, seed, data and a tiny Transformer: the options shared by train and bench."""
    return [
        "--config", str(REPO / "configs" / "transformer.yaml"), "--seed", "3",
        f"data.train_files=[{','.join(files['train'])}]",
        f"data.val_files=[{','.join(files['val'])}]",
        f"data.test_files=[{','.join(files['test'])}]",
        f"data.data_dir={data_dir}", "data.vocab_size=100", "data.max_tokens=600",
        "model.d_model=32", "model.heads=2", "model.ff_dim=64",
        "model.encoder_layers=1", "model.decoder_layers=1",
        "optim.warmup_steps=10",
    ]


def child_processes(pid: int) -> list[int]:
    """The ids of a process' children (Linux's /proc)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):  # a process gone meanwhile
            if f"\nPPid:\t{pid}\n" in status.read_text():
                found.append(int(status.parent.name))
    return found


def run_stopped_while_preparing(argv: list[str]) -> subprocess.CompletedProcess:
    """``nmt ARGV`` in a fresh interpreter whose tokenizer training writes part of its model
    and is then stopped by SIGTERM: a command stopped half-way through preparing a corpus."""
    code = f"""if True:
        import os, signal, sys
        from nmt.data import prepare

        def stopped_half_way(texts, path, vocab_size):
            path.write_bytes(b"half")
            os.kill(os.getpid(), signal.SIGTERM)

        prepare.train_tokenizer = stopped_half_way
        from nmt.cli import main
        sys.exit(main({argv!r}))"""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=300, preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
