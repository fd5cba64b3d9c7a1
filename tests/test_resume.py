"""Exact resume anywhere: a run stopped inside an epoch (step budget, time budget, SIGKILL
after a mid-epoch checkpoint) continues with the batches and dropout draws of an
uninterrupted run and ends with bitwise the same weights. A run directory resumes only with
the options that decide its trajectory unchanged."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from nmt.cli import main
from nmt.config import load_config
from nmt.errors import NMTError
from nmt.processes import RANK_PARENT
from nmt.provenance import code_commit
from nmt.resume import check_resumable, max_len_ratio_effect

from .conftest import REPO, child_processes, run_stopped_while_preparing, tiny_train_args, write_corpus

DROPOUT = ["model.dropout=0.3"]  # dropout draws must line up too


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return folder, write_corpus(folder)


def args(corpus, run_dir, *extra: str) -> list[str]:
    folder, files = corpus
    return tiny_train_args(files, run_dir, folder / "data", epochs=2) + DROPOUT + list(extra)


def checkpoint(run_dir, name="last.ckpt") -> dict:
    return torch.load(run_dir / name, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def straight_dir(corpus, tmp_path_factory) -> Path:
    """A run of two epochs without interruption (4 batches each)."""
    run_dir = tmp_path_factory.mktemp("straight")
    assert main(args(corpus, run_dir)) == 0
    return run_dir


@pytest.fixture(scope="module")
def straight(straight_dir) -> dict:
    return checkpoint(straight_dir)


def logged(run_dir: Path, metric: str) -> list[tuple[str, str]]:
    """(step, value) of each metrics.csv row that has ``metric``, over the run's segments."""
    return [(row["step"], row[metric]) for log in sorted((run_dir / "logs").glob("version_*/metrics.csv"))
            for row in csv.DictReader(open(log)) if row.get(metric)]


def assert_same_weights(run_dir, straight: dict) -> None:
    resumed = checkpoint(run_dir)
    assert resumed["global_step"] == straight["global_step"] == 8
    for name, value in straight["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name


def loader_position(ckpt: dict) -> dict:
    """Where the training loader stood when the checkpoint was written."""
    return ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]


def interrupt_at(monkeypatch, epoch: int, batch: int) -> None:
    """Ctrl-C as training starts batch ``batch`` of epoch ``epoch`` (both from 0), until
    ``monkeypatch.undo()``."""
    from nmt.training import TranslationModule

    start = TranslationModule.on_train_batch_start

    def interrupted(self, this_batch, batch_idx):
        if self.current_epoch == epoch and batch_idx == batch:
            raise KeyboardInterrupt
        return start(self, this_batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "on_train_batch_start", interrupted)


def straight_and_cut(corpus, tmp_path, monkeypatch, options: list[str], epoch: int, batch: int
                     ) -> tuple[Path, Path]:
    """Two runs of ``options``: one uninterrupted, one stopped by Ctrl-C as it starts batch
    ``batch`` of epoch ``epoch``, not yet resumed. Their folders."""
    straight_run, cut = tmp_path / "straight", tmp_path / "cut"
    assert main(args(corpus, straight_run, *options)) == 0
    interrupt_at(monkeypatch, epoch, batch)
    assert main(args(corpus, cut, *options)) == 130
    monkeypatch.undo()
    return straight_run, cut


@pytest.mark.parametrize("budget", [2, 5])  # inside the first epoch; inside the second
def test_step_budget_inside_an_epoch_then_continue(corpus, straight, straight_dir, tmp_path, budget):
    assert main(args(corpus, tmp_path, f"trainer.max_steps={budget}")) == 0
    # Epochs trained: the part of the stopped epoch counts as a part (Lightning counts it whole).
    assert json.loads((tmp_path / "train_stats.json").read_text())["epochs"] == budget / 4
    cut = checkpoint(tmp_path)
    assert cut["global_step"] == budget
    assert loader_position(cut) == {"epoch": budget // 4, "position": budget % 4}
    assert checkpoint(tmp_path, "best.ckpt")["global_step"] <= budget  # the tail was validated
    assert main(args(corpus, tmp_path)) == 0  # the budget raised: same command without it
    assert_same_weights(tmp_path, straight)
    # metrics.csv labels each row with its update as the uninterrupted run does (the resumed
    # segment's rows were one update early).
    assert logged(tmp_path, "train_loss")[budget:] == logged(straight_dir, "train_loss")[budget:]
    assert logged(tmp_path, "val_loss")[-1] == logged(straight_dir, "val_loss")[-1]
    # Each segment names the step it started from and the code and device it ran on.
    segments = json.loads((tmp_path / "train_stats.json").read_text())["segments"]
    assert [s["from_step"] for s in segments] == [0, budget]
    assert {s["code"] for s in segments} == {code_commit()}
    assert all(s["device"].startswith("CPU: ") and s["precision"] for s in segments)


def test_the_progress_bar_of_an_epoch_resumed_inside_counts_from_where_it_stopped(
        corpus, tmp_path, capsys):
    # Lightning starts no epoch at a resume inside one, and its bar said "Training: 3/?" (no
    # total, no time left; a rate counting the skipped batches) for the rest of the epoch.
    bar = ["trainer.enable_progress_bar=true"]
    assert main(args(corpus, tmp_path, *bar, "trainer.max_steps=2")) == 0
    capsys.readouterr()
    assert main(args(corpus, tmp_path, *bar)) == 0
    states = capsys.readouterr().out.replace("\r", "\n").splitlines()
    resumed = [line.split(" [")[0] for line in states if line.startswith("Epoch 0:")]
    assert resumed[1:3] == ["Epoch 0:  50%|█████     | 2/4", "Epoch 0:  75%|███████▌  | 3/4"]


def test_a_run_resumed_after_its_dropout_switch_keeps_the_long_run_dropout(corpus, tmp_path):
    """Both budgets (2 epochs; 5 steps, 1.25 epochs) are long runs, so epoch 2 trains at the
    long-run dropout 0.2. The run stopped inside epoch 2 resumes there, where Lightning starts
    no epoch: it trained on at the model's 0.3 until the next epoch began, and its weights
    left the uninterrupted run's."""
    long_run = ("optim.long_run_dropout=0.2", "optim.long_run_epochs=1.2")
    assert main(args(corpus, tmp_path / "straight", *long_run)) == 0
    assert main(args(corpus, tmp_path / "cut", *long_run, "trainer.max_steps=5")) == 0
    assert main(args(corpus, tmp_path / "cut", *long_run)) == 0
    assert_same_weights(tmp_path / "cut", checkpoint(tmp_path / "straight"))


def test_a_run_stopped_at_an_epoch_end_resumes_under_a_step_budget(corpus, straight, tmp_path):
    """last.ckpt was written after fit as a finished epoch, which Lightning resumes under a
    step budget by skipping the next epoch: updates 5-8 trained on epoch 3's batches."""
    assert main(args(corpus, tmp_path, "--max-epochs", "1")) == 0
    assert main(args(corpus, tmp_path, "trainer.max_steps=8", "--max-epochs", "5")) == 0
    assert_same_weights(tmp_path, straight)
    rows = [row for log in sorted((tmp_path / "logs").glob("version_*/metrics.csv"))
            for row in csv.DictReader(open(log)) if row.get("train_tgt_tok_per_s")]
    assert [row["epoch"] for row in rows] == ["0", "1"]  # one speed a trained epoch, none 0


def _segment_precisions(run_dir: Path) -> list[str]:
    return [s["precision"] for s in json.loads((run_dir / "train_stats.json").read_text())["segments"]]


def probe_answers(monkeypatch, precision: str) -> None:
    """trainer.precision auto's probe on a CPU answers ``precision``."""
    from nmt import trainer
    from nmt.precision import PrecisionChoice

    monkeypatch.setattr(trainer, "choose_cpu_precision",
                        lambda shapes, leader=True: PrecisionChoice(precision, "probed"))


def test_a_resumed_auto_run_keeps_its_precision_unless_one_is_given(corpus, tmp_path, monkeypatch,
                                                                   capsys):
    """trainer.precision auto decides once per run: a resume whose probe answers otherwise (a
    busy machine, another CPU) switched the run's precision midway. It keeps the precision the
    run trained in and says so; a precision given at a resume is taken, and said."""
    auto = "trainer.precision=auto"
    probe_answers(monkeypatch, "32-true")
    assert main(args(corpus, tmp_path, auto, "trainer.max_steps=2")) == 0
    probe_answers(monkeypatch, "bf16-mixed")  # the probe now answers otherwise
    capsys.readouterr()
    assert main(args(corpus, tmp_path, auto, "trainer.max_steps=3")) == 0
    assert "precision: 32-true (auto, as the run has trained so far: kept on resume)\n" \
        in capsys.readouterr().out
    assert _segment_precisions(tmp_path) == ["32-true", "32-true"]
    # Given on the command line, a precision is the user's choice over auto's
    assert main(args(corpus, tmp_path, "trainer.precision=bf16-mixed", "trainer.max_steps=4")) == 0
    assert "precision: bf16-mixed (set in the config; the run trained in 32-true so far)\n" \
        in capsys.readouterr().out
    assert _segment_precisions(tmp_path) == ["32-true", "32-true", "bf16-mixed"]
    # Two precisions given, and different, still change the trajectory: refused
    assert main(args(corpus, tmp_path, "trainer.precision=32-true", "trainer.max_steps=5")) == 1
    assert "holds a run trained with trainer.precision='bf16-mixed', not '32-true'" \
        in capsys.readouterr().err
    # ... but bf16, Lightning's short name for bf16-mixed, is the same precision: resumed
    assert main(args(corpus, tmp_path, "trainer.precision=bf16", "trainer.max_steps=5")) == 0
    assert _segment_precisions(tmp_path)[-1] == "bf16-mixed"
    # ... and auto goes on in the precision given last
    assert main(args(corpus, tmp_path, auto, "trainer.max_steps=6")) == 0
    assert _segment_precisions(tmp_path)[-1] == "bf16-mixed"


def test_a_resumed_auto_run_trained_on_another_device_says_auto_might_choose_otherwise(
        corpus, tmp_path, monkeypatch, capsys):
    """The kept precision may be slow on another kind of machine: the line says where the run
    trained and how to choose."""
    probe_answers(monkeypatch, "32-true")
    assert main(args(corpus, tmp_path, "trainer.precision=auto", "trainer.max_steps=2")) == 0
    moved = checkpoint(tmp_path)
    moved["nmt_segments"][-1].update(device="NVIDIA H200", precision="bf16-mixed")
    torch.save(moved, tmp_path / "last.ckpt")
    capsys.readouterr()
    assert main(args(corpus, tmp_path, "trainer.precision=auto", "trainer.max_steps=3")) == 0
    out = capsys.readouterr().out
    assert "precision: bf16-mixed (auto, as the run has trained so far: kept on resume; it " \
           "trained on NVIDIA H200, and auto might choose otherwise on CPU: " in out
    assert "give trainer.precision to choose)\n" in out


def test_decoding_options_changed_at_a_resume_are_said_in_one_line(corpus, tmp_path, capsys):
    """Decoding options may change on resume, but decoding.max_len_ratio steers validation's
    BLEU, which best.ckpt and early stopping compare with the earlier validations': a
    changed one was taken silently."""
    assert main(args(corpus, tmp_path, "trainer.max_steps=2")) == 0
    capsys.readouterr()
    changed = ("decoding.max_len_ratio=2.0", "decoding.beam_size=3")
    assert main(args(corpus, tmp_path, "trainer.max_steps=3", *changed)) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "decoding options" in line]
    assert lines == ["decoding options differ from the run's config.yaml: decoding.beam_size 5 -> 3, "
                     "decoding.max_len_ratio 1.5 -> 2.0 (validation's greedy BLEU decodes with "
                     "max_len_ratio: from here on the logged val_bleu is not comparable with the "
                     "earlier validations'; best.ckpt and early stopping follow val_loss, which it "
                     "leaves alone); translate and evaluate take the new values"]
    assert main(args(corpus, tmp_path, "trainer.max_steps=4", *changed)) == 0  # as saved now
    assert "decoding options" not in capsys.readouterr().out
    assert main(args(corpus, tmp_path, "trainer.max_steps=5", "decoding.beam_size=4",
                     "decoding.max_len_ratio=2.0")) == 0
    assert "decoding options differ from the run's config.yaml: decoding.beam_size 3 -> 4; " \
           "translate and evaluate take the new values\n" in capsys.readouterr().out


@pytest.mark.parametrize("overrides, weighed", [
    (["trainer.best_metric=val_bleu"],
     "against which trainer.best_metric val_bleu chooses best.ckpt and early stopping waits"),
    (["optim.schedule=plateau"],
     "against which the plateau schedule lowers the learning rate"),
    (["trainer.best_metric=val_bleu", "optim.schedule=plateau"],
     "against which trainer.best_metric val_bleu chooses best.ckpt and early stopping waits and "
     "the plateau schedule lowers the learning rate"),
])
def test_a_changed_max_len_ratio_names_what_weighs_validation_bleu(overrides, weighed):
    """The line said that trainer.best_metric val_bleu chooses best.ckpt to every run, also to
    those (the configs') whose best.ckpt and early stopping follow val_loss, which the ratio
    does not touch; it now names what weighs validation BLEU in this run, where anything does."""
    config = load_config(REPO / "configs" / "transformer.yaml", overrides)
    assert max_len_ratio_effect(config) == (
        "validation's greedy BLEU decodes with max_len_ratio: from here on it is not comparable "
        "with the earlier validations', " + weighed)


def test_resume_from_a_checkpoint_without_segments_says_they_are_unknown(corpus, tmp_path):
    """Checkpoints written before segments were kept resume with an unknown first segment."""
    assert main(args(corpus, tmp_path, "trainer.max_steps=2")) == 0
    old = checkpoint(tmp_path)
    del old["nmt_segments"]
    torch.save(old, tmp_path / "last.ckpt")
    assert main(args(corpus, tmp_path, "trainer.max_steps=3")) == 0
    segments = json.loads((tmp_path / "train_stats.json").read_text())["segments"]
    assert [(s["from_step"], s["code"]) for s in segments] == [(0, None), (2, code_commit())]


def test_time_budget_then_continue(corpus, straight, tmp_path, monkeypatch):
    """Steps slowed to 0.4 s each: a 1-second budget stops inside the first epoch."""
    from nmt.training import TranslationModule

    step = TranslationModule.training_step

    def slow_step(self, batch, batch_idx):
        time.sleep(0.4)
        return step(self, batch, batch_idx)

    monkeypatch.setattr(TranslationModule, "training_step", slow_step)
    assert main(args(corpus, tmp_path, "trainer.max_time=00:00:00:01")) == 0
    assert 0 < checkpoint(tmp_path)["global_step"] < 4
    monkeypatch.undo()
    assert main(args(corpus, tmp_path)) == 0
    assert_same_weights(tmp_path, straight)


SLOW_MAIN = """
import os, signal, sys, time
# Ctrl-C as in a terminal, also where the suite runs in the background (SIGINT ignored there)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # and SIGHUP, also under nohup
from nmt.training import TranslationModule
step = TranslationModule.training_step
def slow_step(self, batch, batch_idx):
    if str(self.global_rank) in os.environ.get("SLOW_RANKS", str(self.global_rank)):
        time.sleep(0.5)
    return step(self, batch, batch_idx)
TranslationModule.training_step = slow_step
from nmt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigkill_after_a_mid_epoch_checkpoint(corpus, straight, tmp_path):
    """Validation (and checkpoints) every 3 batches; the process is killed once the first
    checkpoint, after batch 3 of 4, exists; the same command then finishes the run."""
    command = args(corpus, tmp_path, "trainer.val_check_interval=3")
    # Same thread count as this process, so float reductions run in the same order.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen([sys.executable, "-c", SLOW_MAIN, *command], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (tmp_path / "last.ckpt").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL  # really killed, not finished
    assert loader_position(checkpoint(tmp_path)) == {"epoch": 0, "position": 3}
    assert main(command) == 0
    assert_same_weights(tmp_path, straight)


def test_a_run_stopped_while_its_rate_anneals_resumes_to_the_same_weights(corpus, tmp_path,
                                                                         monkeypatch):
    """A warm-up of 2 updates in the 8 of the budget: the cosine anneals over the rest (the
    tiny runs' warm-up of 10 never reaches it), and its horizon must be the same after the
    resume. Ctrl-C mid-epoch, validations every 3 batches; the same command finishes it."""
    anneal = ["optim.warmup_steps=2", "trainer.val_check_interval=3"]
    straight_run, cut = straight_and_cut(corpus, tmp_path, monkeypatch, anneal, epoch=1, batch=2)
    assert main(args(corpus, cut, *anneal)) == 0
    straight = checkpoint(straight_run)
    assert straight["lr_schedulers"][0]["_last_lr"][0] < 1e-4  # annealed to its floor
    assert_same_weights(cut, straight)


def test_a_checkpoint_inside_an_accumulation_group_resumes_to_the_same_weights(
        corpus, tmp_path, monkeypatch):
    """Groups of 2 batches, validations every 3: the first checkpoint is written after 3
    batches, one step taken and the third batch's gradients summed, and the run is interrupted
    there. The resumed run stepped on the group's second batch alone, and every later weight
    moved; it now goes on from the saved sums and ends as the uninterrupted run."""
    cadence = ["trainer.accumulate_grad_batches=2", "trainer.val_check_interval=3"]
    straight_run, cut = straight_and_cut(corpus, tmp_path, monkeypatch, cadence, epoch=0, batch=3)
    stopped = checkpoint(cut)
    assert stopped["global_step"] == 1 and loader_position(stopped) == {"epoch": 0, "position": 3}
    assert main(args(corpus, cut, *cadence)) == 0
    resumed, straight = checkpoint(cut), checkpoint(straight_run)
    assert resumed["global_step"] == straight["global_step"] == 4
    for name, value in straight["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], value), name


@pytest.mark.parametrize("signal_number,code,message", [
    (signal.SIGTERM, 1, "stopped by SIGTERM: the same command resumes the run"),
    (signal.SIGHUP, 1, "stopped by SIGHUP: the same command resumes the run"),
    (signal.SIGINT, 130, "interrupted: the same command resumes the run"),
])
def test_a_run_stopped_by_a_signal_says_so_and_fails(corpus, tmp_path, signal_number, code, message):
    """A run stopped by SIGTERM (a scheduler's pre-emption), SIGHUP (its terminal closed) or
    Ctrl-C after a checkpoint exits non-zero with one line of its own: Lightning ended the
    first with status 0, as if finished; the second killed it without a word (exit 129); the
    third said "interrupted" alone, not that the run can be resumed."""
    command = args(corpus, tmp_path, "trainer.val_check_interval=3")
    process = subprocess.Popen([sys.executable, "-c", SLOW_MAIN, *command], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (tmp_path / "last.ckpt").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal_number)
    _, err = process.communicate(timeout=300)
    assert process.returncode == code, err[-2000:]
    assert err.splitlines()[-1] == ("error: " * (code == 1)) + f"{message} from its last checkpoint"
    assert not (tmp_path / "train_stats.json").exists()  # not finished


DDP = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "trainer.val_check_interval=2"]


def start_ddp_run(corpus, tmp_path, slow_ranks: str = "01") -> tuple[subprocess.Popen, Path]:
    """A run of two DDP processes with slowed steps (of the ranks in ``slow_ranks``), in a
    process group of its own (as a terminal's job or a scheduler's), once its first
    checkpoint is written. The launcher runs the same script again for the second process,
    so it is a file, not ``-c``."""
    script = tmp_path / "slow_main.py"
    script.write_text(SLOW_MAIN)
    folder, files = corpus
    run_dir = tmp_path / "run"
    command = tiny_train_args(files, run_dir, folder / "data", epochs=5) + DDP
    process = subprocess.Popen([sys.executable, str(script), *command], cwd=REPO,
                               env={**os.environ, "OMP_NUM_THREADS": "1", "SLOW_RANKS": slow_ranks},
                               start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (run_dir / "last.ckpt").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    return process, run_dir


def ended_within(process: subprocess.Popen, seconds: float) -> str:
    """The run's stderr once every process of it has ended (each holds the pipe), failing
    where that took longer than ``seconds``."""
    try:
        return process.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"the run's processes were still running {seconds} s after the signal")


@pytest.mark.parametrize("to_the_group", [True, False], ids=["process-group", "first-process"])
def test_sigterm_stops_every_ddp_process_at_once_with_one_line(corpus, tmp_path, to_the_group):
    """SIGTERM to a DDP run's process group (scancel, systemd) hung it, in Lightning's handler
    (a broadcast from inside it, issue 20806); to its first process alone each process printed
    the line. Now every process ends within seconds, and the first says so once."""
    process, run_dir = start_ddp_run(corpus, tmp_path)
    (os.killpg if to_the_group else os.kill)(process.pid, signal.SIGTERM)
    err = ended_within(process, 15)
    assert process.returncode == 1, err[-2000:]
    assert err.splitlines()[-1] == ("error: stopped by SIGTERM: the same command resumes the run "
                                    "from its last checkpoint")
    assert err.count("stopped by SIGTERM") == 1 and "Traceback" not in err, err[-2000:]
    assert (run_dir / "last.ckpt").is_file() and not (run_dir / "train_stats.json").exists()


def test_sigterm_before_a_ddp_run_trains_stops_it_in_one_line(corpus, tmp_path):
    """SIGTERM to a DDP run before it trained (preparing its corpus: seconds to minutes for a
    large one) killed it without a word (exit status 143) and left the corpus half prepared;
    as once it trains, it now stops with one line, and what was half built is removed."""
    _, files = corpus
    argv = tiny_train_args(files, tmp_path / "run", tmp_path / "data") + DDP
    process = run_stopped_while_preparing(argv)
    assert process.returncode == 128 + signal.SIGTERM, process.stderr[-2000:]
    assert process.stderr.endswith("\nstopped by SIGTERM\n"), process.stderr[-2000:]
    assert "Traceback" not in process.stderr
    assert list((tmp_path / "data" / "prepared").iterdir()) == []
    assert not (tmp_path / "run").exists()


def test_sigterm_while_train_imports_its_libraries_stops_it_in_one_line(corpus, tmp_path):
    """SIGTERM in the seconds nmt train imports torch and Lightning, before it took the signal,
    killed it without a word (exit status 143 of the default); now it stops as it does later,
    in one line. Sent once the process maps libtorch, i.e. while ``import torch`` runs."""
    _, files = corpus
    argv = tiny_train_args(files, tmp_path / "run", tmp_path / "data")
    process = subprocess.Popen([sys.executable, "-m", "nmt", *argv], cwd=REPO, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    maps, deadline = Path(f"/proc/{process.pid}/maps"), time.time() + 60
    while "libtorch_cpu" not in maps.read_text() and time.time() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 128 + signal.SIGTERM, (process.returncode, err[-2000:])
    assert err == "stopped by SIGTERM\n"
    assert not (tmp_path / "run").exists()


def test_a_killed_ddp_worker_ends_the_run_with_one_line(corpus, tmp_path):
    """A DDP worker killed mid-training (SIGKILL: the OOM killer) ended the run with ~40 lines
    of gloo's traceback ("Connection closed by peer"), which named neither the process nor
    what ended it. The first process now says so in one line, and the run resumes. The first
    process waits for the slowed second in each step's collective, which fails at once as the
    second ends: Lightning's observer of the processes, which kills the first without a word
    where it looks (every 5 s) before, has no time to."""
    process, run_dir = start_ddp_run(corpus, tmp_path, slow_ranks="1")
    [worker] = child_processes(process.pid)  # Lightning's launcher runs rank 1 as its child
    os.kill(worker, signal.SIGKILL)
    err = ended_within(process, 15)
    assert process.returncode == 1, err[-2000:]
    assert err.splitlines()[-1] == ("error: a training process (rank 1) ended without a word "
                                    "(killed by SIGKILL: out of memory?): the same command "
                                    "resumes the run from its last checkpoint")
    assert "Traceback" not in err and "by peer" not in err, err[-2000:]
    assert (run_dir / "last.ckpt").is_file() and not (run_dir / "train_stats.json").exists()


def test_a_ddp_worker_dies_with_the_process_that_started_it(corpus, tmp_path):
    """The first process killed (SIGKILL: the OOM killer) while the second starts up left that
    one waiting for it in the rendezvous, for the process group's 30-minute timeout, after the
    command had ended. It now dies with it."""
    folder, files = corpus
    command = tiny_train_args(files, tmp_path / "run", folder / "data", epochs=5) + DDP
    process = subprocess.Popen([sys.executable, "-m", "nmt", *command], cwd=REPO,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Said once the second process is started; it needs seconds more to join
    while "Initializing distributed: GLOBAL_RANK: 0" not in (line := process.stderr.readline()):
        assert line, "the run ended before starting its second process"
    time.sleep(1)
    process.kill()
    ended_within(process, 10)


def test_a_ddp_worker_whose_launcher_ended_before_it_started_ends_too(corpus, tmp_path):
    """The first process stopped in the tenth of a second after it started the second one
    (SIGTERM or SIGKILL at once), before that one armed its death with it, left it running
    alone into the rendezvous, for the process group's 30-minute timeout. It now sees that its
    parent is not the process that started it, and ends. Here the launcher ends as soon as
    the worker is started, as Lightning's started it (the environment copied: LOCAL_RANK, the
    first process's id)."""
    folder, files = corpus
    command = tiny_train_args(files, tmp_path / "run", folder / "data", epochs=5) + DDP
    launcher = f"""if True:
        import os, subprocess, sys
        env = {{**os.environ, "LOCAL_RANK": "1", "{RANK_PARENT}": str(os.getpid())}}
        worker = subprocess.Popen([sys.executable, "-m", "nmt", *{command!r}], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(worker.pid, flush=True)
        os._exit(0)"""
    started = subprocess.run([sys.executable, "-c", launcher], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    worker = int(started.stdout)
    deadline = time.time() + 30  # where it runs on, it waits for the first process for hours
    while running(worker) and time.time() < deadline:
        time.sleep(0.05)
    if running(worker):
        os.kill(worker, signal.SIGKILL)
        pytest.fail("the worker ran on alone after the process that started it had ended")


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has: it waits for its parent
    to read its status)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_a_finished_run_trained_on_and_interrupted_is_not_finished(corpus, straight_dir, tmp_path,
                                                                    monkeypatch):
    """A finished run resumed with more epochs and stopped before it ends has no train_stats.json:
    its figures were of the earlier end (steps, best score, weights chosen), and ``nmt compare``
    takes the file as the run finished, so it recorded the cell from the unfinished run."""
    run = tmp_path / "run"
    shutil.copytree(straight_dir, run)
    assert json.loads((run / "train_stats.json").read_text())["steps"] == 8
    interrupt_at(monkeypatch, epoch=2, batch=1)
    assert main(args(corpus, run, "trainer.max_epochs=3")) == 130
    monkeypatch.undo()
    assert not (run / "train_stats.json").exists()
    assert main(args(corpus, run, "trainer.max_epochs=3")) == 0
    assert json.loads((run / "train_stats.json").read_text())["steps"] == 12


def test_resume_with_a_trajectory_option_changed_is_an_error(corpus, tmp_path, capsys):
    assert main(args(corpus, tmp_path, "trainer.max_steps=1")) == 0
    for change, key in [(["--seed", "4"], "seed"), (["optim.lr=0.002"], "optim.lr"),
                        (["data.max_tokens=500"], "data.max_tokens"),
                        (["trainer.accumulate_grad_batches=2"], "trainer.accumulate_grad_batches")]:
        capsys.readouterr()
        assert main(args(corpus, tmp_path) + change) == 1
        err = capsys.readouterr().err
        assert f"trained with {key}=" in err and err.count("\n") == 1, err
    # Another family differs in many options: the error names the family.
    with pytest.raises(NMTError, match="holds a run trained with model.family='transformer', "
                                       "not 'rnn'"):
        check_resumable(load_config(REPO / "configs" / "rnn_bahdanau.yaml"), tmp_path)
    # Budgets, validation cadence and decoding may change.
    assert main(args(corpus, tmp_path, "trainer.max_steps=2", "trainer.val_check_interval=1",
                     "decoding.beam_size=2")) == 0


def test_resume_after_the_training_files_changed_their_pieces_is_an_error(tmp_path, capsys):
    """Changed training files are prepared anew, with other SentencePiece pieces: resuming
    would read every weight under another id. One line, and the run's own spm.model and config
    stay as they were; files changed but cut into the same pieces resume."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=1"]) == 0
    kept = {name: (run / name).read_bytes() for name in ("spm.model", "config.yaml")}
    source = Path(files["train"][0])
    text = source.read_text(encoding="utf-8")
    os.utime(source, (1e9, 1e9))  # prepared anew (the key has the time), into the same pieces
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=2"]) == 0
    source.write_text(text.replace("a", "ä").replace("e", "é"), encoding="utf-8")
    capsys.readouterr()
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=3"]) == 1
    err = capsys.readouterr().err
    assert "was trained with other SentencePiece pieces than the corpus gives now" in err
    assert err.splitlines()[-1].startswith("error: ") and "Traceback" not in err  # after preparing
    assert (run / "spm.model").read_bytes() == kept["spm.model"]
    assert "max_steps: 2" in (run / "config.yaml").read_text()  # the last segment's, not 3
    (run / "spm.model").unlink()  # gone: which pieces the weights index is unknown
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=3"]) == 1
    assert "spm.model is missing: cannot resume this run" in capsys.readouterr().err
    assert not (run / "spm.model").exists()


def test_checkpoints_that_cannot_be_resumed_are_not_overwritten(corpus, tmp_path, capsys):
    """A run directory whose last.ckpt is gone (say, deleted to keep only best.ckpt) cannot be
    resumed; training a new run there would overwrite its checkpoints, so it is an error."""
    assert main(args(corpus, tmp_path, "trainer.max_steps=1")) == 0
    (tmp_path / "last.ckpt").unlink()
    best = (tmp_path / "best.ckpt").read_bytes()
    capsys.readouterr()
    assert main(args(corpus, tmp_path)) == 1
    err = capsys.readouterr().err
    assert "holds checkpoints (best.ckpt, steps/step1.ckpt) of a run that cannot be resumed" in err
    assert err.count("\n") == 1 and (tmp_path / "best.ckpt").read_bytes() == best
    (tmp_path / "best.ckpt").unlink()  # only the kept steps: a new run would average with them
    assert main(args(corpus, tmp_path)) == 1
    assert "holds checkpoints (steps/step1.ckpt)" in capsys.readouterr().err


def test_a_damaged_last_checkpoint_is_one_line_and_kept(corpus, tmp_path, capsys):
    assert main(args(corpus, tmp_path, "trainer.max_steps=1")) == 0
    last, best = tmp_path / "last.ckpt", (tmp_path / "best.ckpt").read_bytes()
    whole = last.read_bytes()
    weights_only = checkpoint(tmp_path)
    del weights_only["loops"]  # a checkpoint, but not one to resume from
    torch.save(weights_only, last)
    for damage in (None, whole[: len(whole) // 2], b""):  # None: the one without loops
        if damage is not None:
            last.write_bytes(damage)
        kept = last.read_bytes()
        capsys.readouterr()
        assert main(args(corpus, tmp_path, "trainer.max_steps=2")) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: {last} is ") and err.count("\n") == 1
        assert ("not a training checkpoint (it lacks one of" if damage is None else
                "is damaged: cannot resume this run (") in err
        assert last.read_bytes() == kept and (tmp_path / "best.ckpt").read_bytes() == best
    # torch's format before zip files cannot be memory-mapped, but resumes all the same
    torch.save(torch.load(tmp_path / "steps" / "step1.ckpt", weights_only=False), last,
               _use_new_zipfile_serialization=False)
    assert main(args(corpus, tmp_path, "trainer.max_steps=2")) == 0
    assert checkpoint(tmp_path)["global_step"] == 2


@pytest.mark.parametrize("dropped, refused, value", [
    ("long_run_", "optim.long_run_dropout=None, not 0.2", "optim.long_run_dropout=null"),
    ("short_run_", "optim.short_run_dropout=None, not 0.0", "optim.short_run_dropout=null"),
    ("best_metric", "trainer.best_metric='val_bleu', not 'val_loss'", "trainer.best_metric=val_bleu"),
])
def test_a_run_saved_before_an_option_existed_resumes_only_with_what_it_did(
        corpus, tmp_path, capsys, dropped, refused, value):
    """A config.yaml that predates an option means the value that does what the run did: the
    built-in default (optim.long_run_* and short_run_*: off, where the Transformer config now
    sets 0.2 and 0.0), or, where the default does otherwise, ADDED_SINCE's (runs before
    trainer.best_metric picked best.ckpt by val_bleu; the default is val_loss). It resumes
    with that value only, never silently with another trajectory or another metric choosing
    its best.ckpt."""
    assert main(args(corpus, tmp_path, "trainer.max_steps=1")) == 0
    saved = tmp_path / "config.yaml"
    text = saved.read_text()
    old = "\n".join(line for line in text.splitlines() if dropped not in line) + "\n"
    assert old != text
    saved.write_text(old)
    capsys.readouterr()
    assert main(args(corpus, tmp_path)) == 1
    assert f"trained with {refused}" in capsys.readouterr().err
    assert main(args(corpus, tmp_path, value)) == 0


def test_a_model_option_given_at_its_default_resumes(corpus, tmp_path, capsys):
    """The run left model.max_positions out; given now at the Transformer's default (512) it
    builds the same model, which was refused as max_positions=None, not 512."""
    assert main(args(corpus, tmp_path, "trainer.max_steps=1")) == 0
    assert "max_positions" not in (tmp_path / "config.yaml").read_text()
    assert main(args(corpus, tmp_path, "model.max_positions=256")) == 1
    assert "trained with model.max_positions=512, not 256" in capsys.readouterr().err
    assert main(args(corpus, tmp_path, "model.max_positions=512", "trainer.max_steps=2")) == 0
    assert checkpoint(tmp_path)["global_step"] == 2


def test_an_rnn_config_without_embed_init_resumes(corpus, tmp_path):
    """Filling the family's defaults into the command's options made ADDED_SINCE's
    embed_init 'unit' (runs from before the option) the saved run's value: refused as
    'unit', not 'scaled'."""
    folder, files = corpus
    config = tmp_path / "rnn.yaml"
    config.write_text("\n".join(line for line in (REPO / "configs" / "rnn_bahdanau.yaml")
                                 .read_text().splitlines() if "embed_init" not in line))
    argv = [a for a in tiny_train_args(files, tmp_path / "run", folder / "data")
            if not a.startswith("model.")]
    argv[argv.index("--config") + 1] = str(config)
    argv += ["model.emb_dim=16", "model.hidden_size=32", "model.attention_dim=32"]
    assert main([*argv, "trainer.max_steps=1"]) == 0
    assert main([*argv, "trainer.max_steps=2"]) == 0
    assert checkpoint(tmp_path / "run")["global_step"] == 2


def test_a_folder_holding_other_files_is_not_trained_into(corpus, tmp_path, capsys):
    """An export (model.bin, its own config.yaml and spm.model) named as --run-dir had its
    config.yaml and spm.model overwritten by the new run's, and translated garbage after."""
    (tmp_path / "model.bin").write_bytes(b"an exported model")
    (tmp_path / "config.yaml").write_text("exported: true\n")
    assert main(args(corpus, tmp_path)) == 1
    err = capsys.readouterr().err
    assert "holds files a new run would mix with or overwrite (model.bin)" in err
    assert err.count("\n") == 1 and (tmp_path / "config.yaml").read_text() == "exported: true\n"


@pytest.mark.parametrize("cadence,budget,first,last", [
    # every step: stopped at step 3, resumed to step 8
    (["trainer.val_check_interval=1"], 3, ["step2.ckpt", "step3.ckpt"], ["step7.ckpt", "step8.ckpt"]),
    # each epoch's end (4 steps) and the budget's: stopped at step 6, resumed to step 12
    (["--max-epochs", "3"], 6, ["step4.ckpt", "step6.ckpt"], ["step12.ckpt", "step8.ckpt"]),
])
def test_a_resumed_run_keeps_only_its_last_checkpoints(corpus, tmp_path, cadence, budget, first,
                                                       last):
    """Keeping 2: a run stopped by its budget inside an epoch and resumed keeps the last two
    alone, as an uninterrupted run does (the record of kept files in last.ckpt must name the
    one written at the same validation)."""
    keep = [*cadence, "trainer.keep_last_checkpoints=2"]
    assert main(args(corpus, tmp_path, f"trainer.max_steps={budget}", *keep)) == 0
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == first
    assert main(args(corpus, tmp_path, *keep)) == 0
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == last


@pytest.mark.parametrize("keep, left", [(1, ["step8.ckpt"]), (0, None)])
def test_a_run_resumed_keeping_fewer_checkpoints_deletes_the_earlier_ones(corpus, tmp_path, capsys,
                                                                          keep, left):
    """trainer.keep_last_checkpoints lowered on resume applies to the files an earlier segment
    kept: lowered to 0, they stayed in steps/, and nmt average took those old weights for the
    run's last ones. The files deleted are named in one line (they went silently)."""
    every_step = "trainer.val_check_interval=1"
    assert main(args(corpus, tmp_path, "trainer.max_steps=3", every_step,
                     "trainer.keep_last_checkpoints=3")) == 0
    assert len(list((tmp_path / "steps").iterdir())) == 3
    capsys.readouterr()
    assert main(args(corpus, tmp_path, "trainer.max_steps=8", every_step,
                     f"trainer.keep_last_checkpoints={keep}")) == 0
    deleted = ", ".join(f"step{step}.ckpt" for step in range(1, 4 - keep))
    assert (f"trainer.keep_last_checkpoints {keep}: deleted {deleted} (kept in "
            f"{tmp_path / 'steps'} by an earlier segment)\n") in capsys.readouterr().out
    if left is None:
        assert not (tmp_path / "steps").exists()
        capsys.readouterr()
        assert main(["average", "--checkpoint", str(tmp_path)]) == 1
        assert "no step checkpoints in" in capsys.readouterr().err
    else:
        assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == left


def test_resume_after_the_training_pairs_changed_is_an_error(tmp_path, capsys):
    """Two training pairs swapped: the same pieces, other batches from the same positions. A
    resume is refused in one line; a run from before the record was kept resumes unchecked and
    is noted from then on; a file touched but not changed resumes."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=1"]) == 0
    assert json.loads((run / "train_data.json").read_text())["pairs"] == 300
    originals = {path: Path(path).read_text(encoding="utf-8") for path in files["train"]}
    for path, text in originals.items():
        lines = text.splitlines()
        lines[0], lines[1] = lines[1], lines[0]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=2"]) == 1
    err = capsys.readouterr().err
    assert "was trained on other training pairs than the corpus gives now (300 pairs then, " \
           "300 now" in err.splitlines()[-1] and "Traceback" not in err  # after preparing
    assert checkpoint(run)["global_step"] == 1
    (run / "train_data.json").unlink()  # as a run from before the record was kept
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=2"]) == 0
    assert json.loads((run / "train_data.json").read_text())["pairs"] == 300  # noted from now on
    os.utime(files["train"][1], (1e9, 1e9))  # prepared anew, into the same (swapped) pairs
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=3"]) == 0
    for path, text in originals.items():
        Path(path).write_text(text, encoding="utf-8")
    run2 = tmp_path / "run2"  # a start killed before its first checkpoint, on other data
    run2.mkdir()
    (run2 / "train_data.json").write_text('{"pairs": 1, "sha1": "0"}\n')
    assert main(tiny_train_args(files, run2, tmp_path / "data") + ["trainer.max_steps=1"]) == 0
    assert json.loads((run2 / "train_data.json").read_text())["pairs"] == 300  # noted anew
    os.utime(files["train"][0], (1e9, 1e9))  # prepared anew, into the same pairs
    assert main(tiny_train_args(files, run2, tmp_path / "data") + ["trainer.max_steps=2"]) == 0


def test_resume_with_other_validation_pairs_is_an_error(tmp_path, capsys):
    """best.ckpt, early stopping and the plateau schedule compare a resumed run's validation
    scores with the earlier ones: on other validation pairs (data.val_files given anew, or
    their files edited) it trained on and compared them silently. Refused in one line; the
    same pairs in another file resume; a record from before validation was noted resumes
    and notes it."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    base = tiny_train_args(files, run, tmp_path / "data")
    assert main(base + ["trainer.max_steps=1"]) == 0
    capsys.readouterr()
    other = f"data.val_files=[{','.join(files['test'])}]"
    assert main(base + ["trainer.max_steps=2", other]) == 1
    err = capsys.readouterr().err.splitlines()  # after preparing the new corpus
    assert err[-1].startswith(f"error: {run} was validated on other pairs than the corpus gives "
                              "now (40 pairs then, 30 now)"), err
    assert not any("Traceback" in line for line in err)
    assert checkpoint(run)["global_step"] == 1
    copies = [tmp_path / "copy.src", tmp_path / "copy.tgt"]
    for source, copy in zip(files["val"], copies):
        shutil.copy(source, copy)
    assert main(base + ["trainer.max_steps=2", f"data.val_files=[{copies[0]},{copies[1]}]"]) == 0
    record = json.loads((run / "train_data.json").read_text())
    del record["validation"]  # as a run from before the validation pairs were noted
    (run / "train_data.json").write_text(json.dumps(record))
    assert main(base + ["trainer.max_steps=3"]) == 0
    assert json.loads((run / "train_data.json").read_text())["validation"]["pairs"] == 40


def test_a_moved_run_resumes_with_its_record_of_best_and_kept_checkpoints(corpus, tmp_path):
    """The validation BLEU never changes (lr 1e-12): best.ckpt stays the first validation's.
    Moved to another folder and resumed, the run keeps it (Lightning had dropped the record
    of a moved folder, and its first validation replaced best.ckpt) and keeps only its last 2."""
    options = ["trainer.val_check_interval=1", "trainer.keep_last_checkpoints=2", "optim.lr=1e-12",
               "optim.min_lr=0",  # below the rate: frozen, not a rising schedule
               "trainer.best_metric=val_bleu", "trainer.early_stopping_patience=0"]
    first, moved = tmp_path / "first", tmp_path / "moved"
    assert main(args(corpus, first, "trainer.max_steps=3", *options)) == 0
    assert checkpoint(first, "best.ckpt")["global_step"] == 1
    first.rename(moved)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "The dirpath has changed")
        assert main(args(corpus, moved, *options)) == 0
    assert checkpoint(moved, "best.ckpt")["global_step"] == 1
    assert sorted(p.name for p in (moved / "steps").iterdir()) == ["step7.ckpt", "step8.ckpt"]


def test_kept_checkpoints_missing_from_the_record_are_deleted_on_resume(corpus, tmp_path):
    """A last.ckpt written before 916e532 could miss the kept file of its own validation: a
    file the record does not name is still deleted once the run keeps newer ones."""
    keep = ["trainer.val_check_interval=1", "trainer.keep_last_checkpoints=2"]
    assert main(args(corpus, tmp_path, "trainer.max_steps=3", *keep)) == 0
    last = checkpoint(tmp_path)
    for state in last["callbacks"].values():  # as the old order left it: step 3 not named
        if "best_k_models" in state and any("steps" in path for path in state["best_k_models"]):
            state["best_k_models"] = {p: v for p, v in state["best_k_models"].items()
                                      if not p.endswith("step3.ckpt")}
    torch.save(last, tmp_path / "last.ckpt")
    assert main(args(corpus, tmp_path, *keep)) == 0
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["step7.ckpt", "step8.ckpt"]


def test_the_validation_at_the_end_of_the_last_epoch_counts_as_any_other(corpus, tmp_path):
    """Validations every 3 of 2 x 4 batches: the loop validates at updates 3 and 6, and the end
    of the last epoch (update 8) is validated too, as any validation: it keeps its step
    checkpoint, and best.ckpt, train_stats.json and the record of the best in last.ckpt (what a
    resumed run compares its validations with) all name the best of the three; early stopping,
    which decides where the run ends, the best of the cadence's two."""
    options = ["trainer.val_check_interval=3", "trainer.keep_last_checkpoints=2"]
    assert main(args(corpus, tmp_path, *options)) == 0
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["step6.ckpt", "step8.ckpt"]
    with open(tmp_path / "logs" / "version_0" / "metrics.csv") as f:
        scores = {int(r["step"]) + 1: float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]}
    assert sorted(scores) == [3, 6, 8]
    best_step = min(scores, key=scores.get)
    assert checkpoint(tmp_path, "best.ckpt")["global_step"] == best_step
    stats = json.loads((tmp_path / "train_stats.json").read_text())
    assert stats["best_val_loss"] == pytest.approx(scores[best_step], abs=1e-4)
    record = checkpoint(tmp_path)["callbacks"]
    best = next(state for key, state in record.items()
                if key.startswith("ModelCheckpoint{'monitor': 'val_loss'"))
    assert float(best["best_model_score"]) == pytest.approx(scores[best_step], abs=1e-4)
    assert Path(best["best_model_path"]).name == "best.ckpt"
    # Early stopping counts the cadence's validations alone (test_an_early_stopped_run_...)
    stopping = next(state for key, state in record.items() if key.startswith("EarlyStopping"))
    assert float(stopping["best_score"]) == pytest.approx(min(scores[3], scores[6]), abs=1e-4)


def test_a_hand_edited_record_of_the_training_pairs_is_a_one_line_error(tmp_path, capsys):
    """train_data.json whose number of pairs is not a number: the resume is refused in one
    line (formatting it as one was a traceback)."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=1"]) == 0
    (run / "train_data.json").write_text('{"pairs": "300", "sha1": "0"}\n')
    capsys.readouterr()
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["trainer.max_steps=2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "trained on other training pairs than the corpus gives now (? pairs then, 300 now" in err


def test_a_run_that_spent_its_time_budget_says_so_and_a_larger_one_trains_on(corpus, tmp_path,
                                                                             capsys):
    """--max-time counts every segment of the run (Lightning's Timer, kept in checkpoints):
    the same budget again trained nothing and said only how many updates the run had."""
    slow = ["trainer.val_check_interval=1", "data.max_tokens=200", "--max-epochs", "1000"]
    assert main(args(corpus, tmp_path, "--max-time", "00:00:02", *slow)) == 0
    steps = checkpoint(tmp_path)["global_step"]
    capsys.readouterr()
    assert main(args(corpus, tmp_path, "--max-time", "00:00:02", *slow)) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert said.startswith("nothing to train: the run has trained for 0:00:0") and said.endswith(
        " of its --max-time 00:00:02 (every segment counts, validations too): raise it "
        "to train on"), said
    assert checkpoint(tmp_path)["global_step"] == steps
    # A segment without --max-time keeps the clock: it dropped the Timer's state from
    # last.ckpt, and the same budget then trained again from zero.
    spent = checkpoint(tmp_path)["callbacks"]["Timer"]["time_elapsed"]["train"]
    assert main(args(corpus, tmp_path, f"trainer.max_steps={steps + 2}", *slow)) == 0
    assert checkpoint(tmp_path)["callbacks"]["Timer"]["time_elapsed"]["train"] > spent
    steps += 2
    capsys.readouterr()
    assert main(args(corpus, tmp_path, "--max-time", "00:00:02", *slow)) == 0
    assert capsys.readouterr().out.startswith("nothing to train: the run has trained for")
    assert checkpoint(tmp_path)["global_step"] == steps
    # 3 s more than the run has had (a fixed larger budget was spent already on a busy machine)
    spent = checkpoint(tmp_path)["callbacks"]["Timer"]["time_elapsed"]["train"]
    larger = f"00:00:{math.ceil(spent) + 3:02d}"
    assert main(args(corpus, tmp_path, "--max-time", larger, *slow)) == 0
    assert checkpoint(tmp_path)["global_step"] > steps


def test_a_moved_project_resumes_from_its_new_place(corpus, tmp_path, monkeypatch):
    """Corpus files and run directory named from the project folder; the folder moved (a new
    machine, a container's mount), the same command resumes: config.yaml names the corpus
    files where they were (absolute), and the training pairs are compared by content."""
    folder, files = corpus
    project = tmp_path / "project"
    (project / "corpus").mkdir(parents=True)
    for pair in files.values():
        for path in pair:
            shutil.copy(path, project / "corpus")
    relative = {split: [f"corpus/{Path(path).name}" for path in pair] for split, pair in files.items()}
    command = tiny_train_args(relative, Path("run"), Path("data"), epochs=2) + DROPOUT
    monkeypatch.chdir(project)
    assert main([*command, "trainer.max_steps=2"]) == 0
    monkeypatch.chdir(tmp_path)
    project.rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    assert main(command) == 0
    segments = json.loads(Path("run/train_stats.json").read_text())["segments"]
    assert [s["from_step"] for s in segments] == [0, 2]


def test_the_learning_curve_reads_a_runs_segments_in_their_order(tmp_path):
    """scripts/learning_curve.py sorted logs/version_10 before version_2: a run resumed ten
    times drew its curve back in time."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_curve", REPO / "scripts/learning_curve.py")
    learning_curve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning_curve)
    for version in range(12):
        log = tmp_path / "logs" / f"version_{version}" / "metrics.csv"
        log.parent.mkdir(parents=True)
        log.write_text(f"epoch,step,val_bleu,wall_minutes\n{version},{version},{version}.0,{version}.5\n")
    minutes, bleu = learning_curve.curve(tmp_path)
    assert minutes == [v + 0.5 for v in range(12)] and bleu == [float(v) for v in range(12)]


def test_a_run_directory_being_trained_is_not_trained_into_twice(corpus, tmp_path, capsys):
    """Two trainings in one run directory (the same command started twice; compare run again
    while a cell's training, orphaned by a killed worker, trains on) both wrote its
    checkpoints. The second is a one-line error naming the first's process, and the run
    trains once the first has ended. A start that fails leaves no directory behind."""
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from nmt.resume import run_lock\nwith run_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True)\n    time.sleep(120)\n", str(run_dir)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert main(args(corpus, run_dir, "trainer.max_steps=1")) == 1
        assert capsys.readouterr().err == (f"error: {run_dir} is being trained by another process "
                                           f"(pid {holder.pid} on {socket.gethostname()}): let it end, "
                                           "or stop it, then run this again\n")
        assert sorted(path.name for path in run_dir.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert main(args(corpus, run_dir, "trainer.max_steps=1")) == 0
    assert (run_dir / "last.ckpt").is_file()
    missing = tmp_path / "new" / "run"  # fails after the lock is taken: the corpus is not there
    assert main(args(corpus, missing, "data.train_files=[nowhere.src,nowhere.tgt]")) == 1
    assert "nowhere.src" in capsys.readouterr().err and not missing.exists()


def test_a_failed_start_removes_the_folders_made_for_it(corpus, tmp_path, capsys):
    """A start that failed removed its run directory but not the parents it had made for it
    (runs/new/ of --run-dir runs/new/run stayed, empty). A folder that was there is kept."""
    missing = tmp_path / "new" / "deeper" / "run"
    assert main(args(corpus, missing, "data.train_files=[nowhere.src,nowhere.tgt]")) == 1
    assert "nowhere.src" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_a_start_there_meanwhile_does_not_hide_why_a_start_failed(corpus, tmp_path, monkeypatch,
                                                                  capsys):
    """A failed start removes its lock file, then its folder: a second start that made its own
    lock file there in between (a command started twice) made the first's error 'Directory not
    empty' in place of its own. The folder is left to the second."""
    run_dir = tmp_path / "new" / "run"
    unlink = Path.unlink

    def another_start_between(self, *arguments, **options):
        unlink(self, *arguments, **options)
        if self.name == ".lock":
            self.write_text("123\n")  # the second start's lock file, opened as the first's went

    monkeypatch.setattr(Path, "unlink", another_start_between)
    assert main(args(corpus, run_dir, "data.train_files=[nowhere.src,nowhere.tgt]")) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: data.train_files: no such file") and err.count("\n") == 1
    assert sorted(path.name for path in run_dir.iterdir()) == [".lock"]


def test_the_other_ranks_of_every_launcher_run_without_the_lock(tmp_path, monkeypatch):
    """The run's first process holds the lock; the others run the same command and must not
    take it. Under mpirun (Lightning's MPI environment; with mpi4py) and LSF's jsrun, whose
    ranks set none of LOCAL_RANK, NODE_RANK, RANK or SLURM_PROCID, rank 1 stopped with 'being
    trained by another process', and the run with it. Where Lightning sees each process alone
    (mpirun without mpi4py, a sweep of srun tasks), each takes the lock of its own run
    directory: rank 1 trained past it into the directory rank 0 held, each the whole run."""
    from nmt.resume import RANK_VARIABLES, run_lock

    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from nmt.resume import run_lock\nwith run_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True)\n    time.sleep(120)\n", str(run_dir)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k not in RANK_VARIABLES})
    try:
        assert holder.stdout.readline() == "held\n"
        for name in RANK_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "JSM_NAMESPACE_RANK"):
            with monkeypatch.context() as env:
                env.setenv(name, "1")
                with run_lock(run_dir, processes=2):  # rank 1 of an MPI or LSF run: no error
                    pass
                with pytest.raises(NMTError, match="being trained by another process"):
                    with run_lock(run_dir):  # ... that Lightning sees alone: refused
                        pass
                with run_lock(tmp_path / f"own_{name}"):  # a sweep's own run directory
                    assert (tmp_path / f"own_{name}" / ".lock").is_file()
        with pytest.raises(NMTError, match="being trained by another process"):
            with run_lock(run_dir):  # a second run's first process: refused, as before
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_launchers_process_that_lightning_sees_alone_trains_its_own_run(corpus, tmp_path,
                                                                         monkeypatch):
    """A sweep, each process of mpirun (here without mpi4py, so Lightning sees one process)
    training its own run: it trains, holding that run's lock (a second process there is
    refused, test_the_other_ranks_of_every_launcher_run_without_the_lock)."""
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert main(args(corpus, tmp_path / "r1", "trainer.max_steps=1")) == 0
    assert json.loads((tmp_path / "r1" / "train_stats.json").read_text())["steps"] == 1


def test_resume_with_fewer_epochs_than_trained_trains_nothing_and_says_so(tmp_path, capsys):
    """--max-epochs lowered below the epochs a run has ended: nothing to train, said in one
    line, as for a spent time budget. Lightning refused the checkpoint with a traceback."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main(tiny_train_args(files, run, tmp_path / "data", epochs=3)) == 0
    stats = (run / "train_stats.json").read_text()
    capsys.readouterr()
    assert main(tiny_train_args(files, run, tmp_path / "data", epochs=1)) == 0
    out, err = capsys.readouterr()
    assert "nothing to train: the run has trained into epoch 3 (to update " in out
    assert "past --max-epochs 1: raise it to train on" in out
    assert "Traceback" not in err and "error" not in err
    assert (run / "train_stats.json").read_text() == stats  # its final weights still chosen


def test_the_command_of_a_finished_run_again_trains_nothing_and_says_so(corpus, straight_dir,
                                                                       tmp_path, capsys):
    """A run finished by its epochs or steps, run again with the same budget: Lightning ended
    at once, but a new logs/version_N was left empty, the weights chosen anew and the summary
    printed as if it had trained. A budget raised trains on."""
    run = tmp_path / "run"
    shutil.copytree(straight_dir, run)
    stats, logs = (run / "train_stats.json").read_text(), sorted((run / "logs").iterdir())
    capsys.readouterr()
    assert main(args(corpus, run)) == 0
    assert "nothing to train: the run has finished its --max-epochs (2 epochs, to update 8): " \
        "raise it to train on" in capsys.readouterr().out
    assert (run / "train_stats.json").read_text() == stats
    assert sorted((run / "logs").iterdir()) == logs
    steps = tmp_path / "steps"
    assert main(args(corpus, steps, "trainer.max_steps=3")) == 0
    capsys.readouterr()
    assert main(args(corpus, steps, "trainer.max_steps=3")) == 0
    assert "the run has finished its --trainer.max_steps (3 updates, to update 3)" in capsys.readouterr().out
    assert main(args(corpus, steps, "trainer.max_steps=5")) == 0
    assert json.loads((steps / "train_stats.json").read_text())["steps"] == 5
    # "epochs" is rounded: 1,999 updates of 2 epochs of 1,000 read 2.0 (here 7 of 8, written so)
    assert main(args(corpus, steps, "trainer.max_steps=7")) == 0
    stats = json.loads((steps / "train_stats.json").read_text())
    assert stats["steps_per_epoch"] == 4
    (steps / "train_stats.json").write_text(json.dumps({**stats, "epochs": 2.0}))
    assert main(args(corpus, steps)) == 0  # --max-epochs 2: the last update is left to train
    assert json.loads((steps / "train_stats.json").read_text())["steps"] == 8


def test_a_resumed_run_logs_each_update_once(corpus, tmp_path, monkeypatch):
    """A run interrupted after its checkpoint logged the updates it took since; the resumed run
    takes and logs them again in its own version. The earlier version's rows of those updates
    are dropped, as are those of a start that left no checkpoint: the versions together hold
    each update's training row once, and every validation's once."""
    interrupt_at(monkeypatch, epoch=1, batch=1)  # the sixth batch: 4 batches an epoch
    # a start stopped before its first checkpoint: the next start is a new run
    assert main(args(corpus, tmp_path, "trainer.val_check_interval=7")) == 130
    assert not (tmp_path / "last.ckpt").exists()
    assert main(args(corpus, tmp_path, "trainer.val_check_interval=3")) == 130
    monkeypatch.undo()
    assert checkpoint(tmp_path)["global_step"] == 3
    assert main(args(corpus, tmp_path, "trainer.val_check_interval=3")) == 0
    rows = [row for path in sorted((tmp_path / "logs").glob("version_*/metrics.csv"))
            for row in csv.DictReader(path.open(newline=""))]
    trained = [int(row["step"]) for row in rows if row.get("train_loss")]
    validated = [int(row["step"]) for row in rows if row.get("val_loss")]
    assert trained == list(range(8)), trained
    assert validated == [2, 5, 7], validated


def test_a_plateau_run_stopped_by_a_step_budget_resumes_at_the_uninterrupted_rates(corpus, tmp_path):
    """The plateau schedule (patience 0: a validation whose BLEU is not above the best halves
    the rate) steps at the validations of the cadence, each epoch's end. The validation that
    the step budget added at update 2 stepped it too: the resumed run trained updates 5-8 at
    half the uninterrupted run's rate, and ended with other weights."""
    plateau = ("optim.schedule=plateau", "optim.plateau_patience=0", "optim.lr=0.01")
    assert main(args(corpus, tmp_path / "straight", *plateau)) == 0
    assert main(args(corpus, tmp_path / "cut", *plateau, "trainer.max_steps=2")) == 0
    assert main(args(corpus, tmp_path / "cut", *plateau)) == 0
    straight_run, resumed = checkpoint(tmp_path / "straight"), checkpoint(tmp_path / "cut")
    assert resumed["lr_schedulers"] == straight_run["lr_schedulers"]
    assert_same_weights(tmp_path / "cut", straight_run)


def test_an_early_stopped_run_stopped_by_a_step_budget_before_ends_where_an_uninterrupted_one_does(
        corpus, tmp_path):
    """BLEU never changes (lr 1e-12), validated at each epoch's end (4 batches) with patience 1:
    the uninterrupted run stops at update 8. Cut at update 2 by a step budget, whose
    validation counted as the best, the resumed run had waited its 1 validation at update 4
    and stopped there, 4 updates short."""
    stopping = ("optim.lr=1e-12", "optim.min_lr=0", "trainer.best_metric=val_bleu",
                "trainer.early_stopping_patience=1", "--max-epochs", "4")
    assert main(args(corpus, tmp_path / "straight", *stopping)) == 0
    assert main(args(corpus, tmp_path / "cut", *stopping, "trainer.max_steps=2")) == 0
    assert main(args(corpus, tmp_path / "cut", *stopping)) == 0
    assert checkpoint(tmp_path / "straight")["global_step"] == 8
    assert checkpoint(tmp_path / "cut")["global_step"] == 8
