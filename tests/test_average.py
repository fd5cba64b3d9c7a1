"""Checkpoint averaging: the element-wise mean, the run keeping its last N checkpoints, and
translate / evaluate using the averaged weights."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.average import average_run, final_weights, step_checkpoints
from nmt.cli import main
from nmt.errors import NMTError
from nmt.files import WriteErrorKept, save_atomic
from nmt.resume import forget_finished
from nmt.translator import find_checkpoint

from .conftest import tiny_train_args, write_corpus


def _save(path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, "global_step": 0}, path)


def test_averaging_two_checkpoints_gives_the_elementwise_mean(tmp_path):
    a = {"model.w": torch.randn(3, 4), "model.h": torch.randn(5, dtype=torch.float16),
         "model.count": torch.tensor(7)}
    b = {"model.w": torch.randn(3, 4), "model.h": torch.randn(5, dtype=torch.float16),
         "model.count": torch.tensor(7)}
    _save(tmp_path / "steps" / "step90.ckpt", a)
    _save(tmp_path / "steps" / "step100.ckpt", b)  # newer, though it sorts first as text
    _save(tmp_path / "steps" / "step9.ckpt", {k: v * 0 for k, v in a.items()})  # oldest
    assert [p.name for p in step_checkpoints(tmp_path)] == ["step9.ckpt", "step90.ckpt",
                                                           "step100.ckpt"]
    out, used = average_run(tmp_path, last=2)
    assert out == tmp_path / "averaged.ckpt" and [p.name for p in used] == ["step90.ckpt",
                                                                            "step100.ckpt"]
    averaged = torch.load(out)["state_dict"]
    torch.testing.assert_close(averaged["model.w"], (a["model.w"] + b["model.w"]) / 2)
    assert averaged["model.h"].dtype == torch.float16
    torch.testing.assert_close(averaged["model.h"], ((a["model.h"].float() + b["model.h"].float())
                                                     / 2).half())
    assert averaged["model.count"].item() == 7


@pytest.mark.parametrize("other", [{"model.v": torch.zeros(2)},  # other names
                                   {"model.w": torch.zeros(3)}])  # other sizes (vocabulary)
def test_checkpoints_of_different_models_are_refused(tmp_path, other):
    _save(tmp_path / "steps" / "step1.ckpt", {"model.w": torch.zeros(2)})
    _save(tmp_path / "steps" / "step2.ckpt", other)
    with pytest.raises(NMTError, match="not the same model"):
        average_run(tmp_path)


def test_a_run_keeps_its_last_checkpoints_and_translates_with_their_average(tmp_path, capsys,
                                                                             monkeypatch):
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    args = tiny_train_args(files, run, tmp_path / "data", epochs=3)
    assert main(args + ["trainer.keep_last_checkpoints=2"]) == 0
    kept = step_checkpoints(run)
    assert len(kept) == 2  # three validations, the oldest checkpoint deleted
    assert main(["average", "--checkpoint", str(run)]) == 0
    assert (run / "averaged.ckpt").is_file()
    capsys.readouterr()
    for last, said in (("1", "averaged 1 checkpoint ("), ("5", "(--last 5: the run kept only 2)")):
        assert main(["average", "--checkpoint", str(run), "--last", last,
                     "--out", str(tmp_path / f"last{last}.ckpt")]) == 0
        assert said in capsys.readouterr().out
    assert main(["evaluate", "--checkpoint", str(run), "--weights", "averaged.ckpt",
                 "--beam", "2"]) == 0
    assert (run / "eval" / "test.beam2.averaged.json").is_file()
    step = kept[-1].relative_to(tmp_path)  # e.g. run/steps/step9.ckpt: a path from here
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--checkpoint", "run", "--weights", str(step), "--beam", "2"]) == 0
    assert (run / "eval" / f"test.beam2.{step.stem}.json").is_file()
    (tmp_path / "stray.ckpt").write_bytes(step.read_bytes())  # a bare name is the run's only
    assert main(["evaluate", "--checkpoint", "run", "--weights", "stray.ckpt", "--beam", "2"]) == 1
    capsys.readouterr()
    assert main(["average", "--checkpoint", str(run), "--last", "0"]) == 1
    assert main(["translate", "--checkpoint", str(run), "--weights", "nothing.ckpt"]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "--last" in errors[0] and "nothing.ckpt" in errors[1]


def test_average_of_a_run_without_kept_checkpoints_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("name: run\n")  # a run (a folder without is none)
    assert main(["average", "--checkpoint", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "keep_last_checkpoints" in err


@pytest.mark.parametrize("best_step, keep, chosen, averaged", [
    (50, 2, "averaged.ckpt", "ab"), (90, 2, "best.ckpt", ""),
    (95, 1, "averaged.ckpt", "b"),  # only the last `keep`: a run resumed with fewer kept
    (50, 0, "best.ckpt", ""),  # resumed with none kept: the files in steps/ are stale
])
def test_final_weights_average_the_kept_checkpoints_when_best_is_older_than_all(
        tmp_path, best_step, keep, chosen, averaged):
    states = {"a": {"model.w": torch.randn(3)}, "b": {"model.w": torch.randn(3)}}
    _save(tmp_path / "steps" / "step90.ckpt", states["a"])
    _save(tmp_path / "steps" / "step100.ckpt", states["b"])
    torch.save({"state_dict": states["a"], "global_step": best_step}, tmp_path / "best.ckpt")
    weights, why = final_weights(tmp_path, keep)
    assert weights == chosen and (keep == 0 or f"best.ckpt (update {best_step})" in why)
    assert (tmp_path / "averaged.ckpt").is_file() == bool(averaged)
    if averaged:
        mean = sum(states[k]["model.w"] for k in averaged) / len(averaged)
        torch.testing.assert_close(torch.load(tmp_path / "averaged.ckpt")["state_dict"]["model.w"],
                                   mean)


def test_final_weights_without_kept_checkpoints_or_best(tmp_path):
    torch.save({"state_dict": {}, "global_step": 5}, tmp_path / "best.ckpt")
    assert final_weights(tmp_path, 5)[0] == "best.ckpt"
    assert not (tmp_path / "averaged.ckpt").exists()
    (tmp_path / "best.ckpt").unlink()
    assert final_weights(tmp_path, 5) == ("last.ckpt", "no validation wrote a best.ckpt")


@pytest.mark.parametrize("state", [[torch.zeros(2)],  # not a dict
                                   {"model": {"w": torch.zeros(2)}},  # parts nested
                                   {"model.w": torch.zeros(2), "model.note": None}])
def test_a_checkpoint_whose_state_dict_is_not_tensors_is_one_line(tmp_path, capsys, state):
    """Another program's checkpoint with a state_dict key: an AttributeError's traceback."""
    _save(tmp_path / "steps" / "step1.ckpt", state)
    _save(tmp_path / "steps" / "step2.ckpt", {"model.w": torch.zeros(2)})
    assert main(["average", "--checkpoint", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'steps' / 'step1.ckpt'} is not a training checkpoint (its "
                   "state_dict is not a tensor per weight's name)\n")
    assert not (tmp_path / "averaged.ckpt").exists()


def test_a_damaged_kept_checkpoint_leaves_best(tmp_path):
    _save(tmp_path / "steps" / "step90.ckpt", {"model.w": torch.randn(3)})
    (tmp_path / "steps" / "step100.ckpt").write_bytes(b"not a checkpoint")
    torch.save({"state_dict": {}, "global_step": 50}, tmp_path / "best.ckpt")
    weights, why = final_weights(tmp_path, 2)
    assert weights == "best.ckpt" and why.startswith("averaging failed: cannot load")
    assert not (tmp_path / "averaged.ckpt").exists()


def test_translation_takes_the_weights_training_chose_unless_told(tmp_path, capsys):
    for name in ("best.ckpt", "last.ckpt", "averaged.ckpt"):
        (tmp_path / name).write_bytes(b"")
    assert find_checkpoint(tmp_path) == tmp_path / "best.ckpt"  # a run from before the choice
    stats = tmp_path / "train_stats.json"
    stats.write_text(json.dumps({"final_weights": "averaged.ckpt"}))
    assert find_checkpoint(tmp_path) == tmp_path / "averaged.ckpt"
    assert find_checkpoint(tmp_path, "last.ckpt") == tmp_path / "last.ckpt"
    assert capsys.readouterr().err == ""
    (tmp_path / "averaged.ckpt").unlink()  # deleted since: the next one, and a word on it
    assert find_checkpoint(tmp_path) == tmp_path / "best.ckpt"
    assert capsys.readouterr().err == (f"warning: {tmp_path / 'averaged.ckpt'}, the weights "
                                       "training chose, is gone: using best.ckpt\n")
    (tmp_path / "averaged.ckpt").write_bytes(b"")
    forget_finished(tmp_path)  # what resuming the run does first: no choice until it ends
    assert find_checkpoint(tmp_path) == tmp_path / "best.ckpt"
    assert not stats.exists()


def test_weights_from_here_are_never_the_runs_file_of_that_name(tmp_path, monkeypatch):
    """--weights ./averaged.ckpt decoded with RUN/averaged.ckpt: Path("./x") is Path("x")."""
    run, here = tmp_path / "run", tmp_path / "here"
    for folder in (run / "steps", here / "steps"):
        folder.mkdir(parents=True)
        (folder.parent / "averaged.ckpt").write_bytes(b"")
        (folder / "step4.ckpt").write_bytes(b"")
    monkeypatch.chdir(here)
    assert find_checkpoint(run, "averaged.ckpt") == run / "averaged.ckpt"  # a bare name: the run's
    assert find_checkpoint(run, "./averaged.ckpt") == Path("averaged.ckpt")  # here's
    assert find_checkpoint(run, "steps/step4.ckpt") == run / "steps/step4.ckpt"  # the run's first
    assert find_checkpoint(run, "./steps/step4.ckpt") == Path("steps/step4.ckpt")
    (tmp_path / "averaged.ckpt").write_bytes(b"")  # RUN/../averaged.ckpt
    (here / "deeper").mkdir()
    monkeypatch.chdir(here / "deeper")
    assert find_checkpoint(run, "../averaged.ckpt") == Path("../averaged.ckpt")  # here's
    (run / "only.ckpt").write_bytes(b"")
    with pytest.raises(NMTError, match=re.escape(
            f"weights file not found: ./only.ckpt ({here / 'deeper' / 'only.ckpt'}); "
            f"{run / 'only.ckpt'} exists: give only.ckpt for it")):
        find_checkpoint(run, "./only.ckpt")  # not the run's
    with pytest.raises(NMTError, match=re.escape(f"{run / 'only.ckpt'} exists: give only.ckpt")):
        find_checkpoint(run, "././only.ckpt")
    with pytest.raises(NMTError, match=r"\(.*none.ckpt\)$"):  # no hint to a file not there
        find_checkpoint(run, "./none.ckpt")
    (run / "steps" / "folder.ckpt").mkdir()  # said "weights file not found", in plain sight
    folder = run / "steps" / "folder.ckpt"
    with pytest.raises(NMTError, match=re.escape(f"--weights steps/folder.ckpt: {folder} is a "
                                                 "folder; name a checkpoint file")):
        find_checkpoint(run, "steps/folder.ckpt")


def test_a_bare_weights_name_not_in_the_run_points_to_the_current_folders_file(tmp_path, monkeypatch):
    """nmt average --out avg.ckpt writes avg.ckpt here; --weights avg.ckpt looks in the run
    alone, and said only that RUN/avg.ckpt was not found, with the file in plain sight."""
    run, here = tmp_path / "run", tmp_path / "here"
    run.mkdir()
    here.mkdir()
    (here / "avg.ckpt").write_bytes(b"")
    monkeypatch.chdir(here)
    with pytest.raises(NMTError, match=re.escape(
            f"weights file not found: {run / 'avg.ckpt'}; avg.ckpt is in the current folder, "
            "where a bare name is not looked for: give ./avg.ckpt for it")):
        find_checkpoint(run, "avg.ckpt")
    with pytest.raises(NMTError, match=r"none\.ckpt$"):  # no hint to a file not there
        find_checkpoint(run, "none.ckpt")


def test_a_run_past_its_best_validation_ends_with_averaged_weights(tmp_path, capsys):
    """At a learning rate of 1e-12 the validation BLEU never changes, so the first validation
    stays the best and best.ckpt is older than the last 2 checkpoints of 4 epochs: training
    averages them and evaluate takes them."""
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main([*tiny_train_args(files, run, tmp_path / "data", epochs=4), "optim.lr=1e-12",
                 "optim.min_lr=0",  # below the rate: frozen, not a rising schedule
                 "trainer.best_metric=val_bleu", "trainer.keep_last_checkpoints=2",
                 "trainer.early_stopping_patience=0"]) == 0
    assert "translate and evaluate use averaged.ckpt: best.ckpt (update" in capsys.readouterr().out
    assert json.loads((run / "train_stats.json").read_text())["final_weights"] == "averaged.ckpt"
    assert main(["evaluate", "--checkpoint", str(run), "--beam", "1"]) == 0
    assert json.loads((run / "eval" / "test.beam1.json").read_text())["weights"] == "averaged.ckpt"


@pytest.mark.parametrize("out", ["best.ckpt", "last.ckpt", "steps/step9.ckpt", "spm.model",
                                 "config.yaml", "train_stats.json", "logs/x.ckpt.csv"])
def test_the_average_never_overwrites_the_runs_own_files(tmp_path, out):
    _save(tmp_path / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    _save(tmp_path / "best.ckpt", {"model.w": torch.zeros(2)})
    for name in ("spm.model", "config.yaml", "train_stats.json", "logs/x.ckpt.csv"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(NMTError, match="is one of the own files of the run .*; name another .ckpt"):
        average_run(tmp_path, out=tmp_path / out)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_checkpoint_linked_from_elsewhere_is_still_the_runs_own(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere.ckpt"
    _save(run / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    _save(elsewhere, {"model.w": torch.zeros(2)})
    (run / "best.ckpt").symlink_to(elsewhere)
    before = elsewhere.read_bytes()
    with pytest.raises(NMTError, match="is one of the own files of the run"):
        average_run(run, out=run / "best.ckpt")
    assert elsewhere.read_bytes() == before


def test_a_new_file_inside_a_run_must_be_a_ckpt_and_is_not_called_the_runs_own(tmp_path):
    """--out RUN/notes.txt, a file that does not exist, was refused as "one of the own files
    of the run": the rule is that inside a run only a new .ckpt may go."""
    _save(tmp_path / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    with pytest.raises(NMTError, match=r"is inside the run .*, where only a new \.ckpt may go"):
        average_run(tmp_path, out=tmp_path / "notes.txt")
    assert not (tmp_path / "notes.txt").exists()


def test_the_average_training_chose_is_not_replaced_by_another(tmp_path):
    """Where training chose averaged.ckpt as the run's weights, averaging other checkpoints into
    it would change what translate uses without a word: an error, unless it is the same
    average; another file takes any."""
    for step in (1, 2, 3):
        _save(tmp_path / "steps" / f"step{step}.ckpt", {"model.w": torch.full((2,), float(step))})
    average_run(tmp_path, last=2)
    (tmp_path / "train_stats.json").write_text(json.dumps({"final_weights": "averaged.ckpt"}))
    chosen = (tmp_path / "averaged.ckpt").read_bytes()
    with pytest.raises(NMTError, match="is the average of step2.ckpt, step3.ckpt that training chose"):
        average_run(tmp_path, last=3)
    assert (tmp_path / "averaged.ckpt").read_bytes() == chosen
    average_run(tmp_path, last=2)  # the same average again
    out, _ = average_run(tmp_path, last=3, out=tmp_path / "all.ckpt")
    assert torch.load(out)["state_dict"]["model.w"].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("chosen", ["averaged.ckpt", "best.ckpt"])
@pytest.mark.parametrize("out", ["averaged.ckpt", "best.ckpt", "config.yaml", "steps/step1.ckpt"])
def test_the_average_never_overwrites_another_runs_files(tmp_path, out, chosen):
    """--out into another run's folder replaced its files, the weights its training chose
    among them, so that translating with that run silently used this one's."""
    this, other = tmp_path / "this", tmp_path / "other"
    _save(this / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    _save(other / "steps" / "step1.ckpt", {"model.w": torch.zeros(2)})
    average_run(other)
    (other / "train_stats.json").write_text(json.dumps({"final_weights": chosen}))
    for name in ("config.yaml", "spm.model"):
        (other / name).write_text(name)
    _save(other / "best.ckpt", {"model.w": torch.zeros(2)})
    before = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    with pytest.raises(NMTError, match=f"(own files|a file) of the run {other}"):
        average_run(this, out=other / out)
    assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    average_run(this, out=other / "from_this.ckpt")  # a new .ckpt beside them may go there


def test_an_average_is_not_written_where_another_run_keeps_its_own(tmp_path):
    """Another run whose training chose averaged.ckpt, the file since gone: --out
    OTHER/averaged.ckpt wrote this run's average there, and translating with that run then used
    it as its own weights without a word."""
    this, other = tmp_path / "this", tmp_path / "other"
    _save(this / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    for name in ("config.yaml", "spm.model"):
        (other / name).parent.mkdir(parents=True, exist_ok=True)
        (other / name).write_text(name)
    (other / "train_stats.json").write_text(json.dumps({"final_weights": "averaged.ckpt"}))
    with pytest.raises(NMTError, match=f"is where the run {other} keeps its own average"):
        average_run(this, out=other / "averaged.ckpt")
    assert not (other / "averaged.ckpt").exists()


def test_an_average_may_go_under_a_folder_that_is_not_a_run(tmp_path):
    """A project folder with a config.yaml of its own is no run: the average goes there."""
    _save(tmp_path / "run" / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    (tmp_path / "project" / "exports").mkdir(parents=True)
    (tmp_path / "project" / "config.yaml").write_text("mine")
    out, _ = average_run(tmp_path / "run", out=tmp_path / "project" / "exports" / "avg.pt")
    assert out.is_file()


def test_a_failed_write_of_the_average_is_a_one_line_error(tmp_path, capsys):
    """torch.save reports a full disk (or a file size limit) as a RuntimeError: a traceback,
    then torch's own check, 'cannot write /dev/full: [enforce fail at inline_container.cc:672]
    . unexpected pos 64 vs 0'; now the cause, in one line."""
    _save(tmp_path / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    assert main(["average", "--checkpoint", str(tmp_path), "--out", "/dev/full"]) == 1
    assert capsys.readouterr().err == "error: cannot write /dev/full: No space left on device\n"


def test_an_average_cut_short_by_a_file_size_limit_leaves_nothing_half_written(tmp_path):
    """A regular file that cannot grow (a file size limit here, a full disk alike): the cause
    in one line, and neither the file nor its temporary one left behind."""
    _save(tmp_path / "steps" / "step9.ckpt", {"model.w": torch.ones(100_000)})
    code = f"""if True:
        import resource, signal, sys
        from nmt.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        sys.exit(main(["average", "--checkpoint", {str(tmp_path)!r}]))"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == f"error: cannot write {tmp_path / 'averaged.ckpt'}: File too large\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps"]


def test_an_average_that_cannot_be_written_leaves_no_temporary_file(tmp_path):
    _save(tmp_path / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    (tmp_path / "a_folder.ckpt").mkdir()
    with pytest.raises(NMTError, match="a_folder.ckpt is a directory"):
        average_run(tmp_path, out=tmp_path / "a_folder.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_folder.ckpt", "steps"]


def test_an_average_never_replaces_a_file_that_is_not_a_checkpoint(tmp_path):
    """--out corpus.de replaced the corpus file; an earlier average (any name) may be replaced."""
    _save(tmp_path / "run" / "steps" / "step9.ckpt", {"model.w": torch.ones(2)})
    corpus = tmp_path / "corpus.de"
    corpus.write_text("ein Haus\n")
    with pytest.raises(NMTError, match="exists and is not a checkpoint"):
        average_run(tmp_path / "run", out=corpus)
    assert corpus.read_text() == "ein Haus\n"
    for _ in range(2):  # the second time over the first's file
        out, _ = average_run(tmp_path / "run", out=tmp_path / "avg.pt")
    assert torch.load(out)["state_dict"]["model.w"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_an_average_stopped_part_of_the_way_leaves_no_file_behind(tmp_path, stop):
    """SIGTERM (a scheduler, kill) or SIGHUP while the average was written left its hidden
    temporary file (a model's size) in the run for good; as on Ctrl-C, it is now removed."""
    for step in (4, 8):
        _save(tmp_path / "steps" / f"step{step}.ckpt", {"model.w": torch.randn(3)})
    code = f"""if True:
        import os, sys, torch
        from nmt.cli import main

        def stopped_half_way(obj, file, *args, **kwargs):  # save_atomic gives an open file
            file.write(b"half")
            file.flush()
            os.kill(os.getpid(), {int(stop)})

        torch.save = stopped_half_way
        sys.exit(main(["average", "--checkpoint", {str(tmp_path)!r}]))"""
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300, preexec_fn=lambda: signal.signal(stop, signal.SIG_DFL))
    assert process.returncode == 128 + stop, process.stderr  # as the signal's default
    assert process.stderr.endswith(f"stopped by {stop.name}\n"), process.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["steps"]


def test_a_stop_signal_during_a_checkpoint_write_stops_the_run_as_itself(tmp_path, monkeypatch,
                                                                        ctrl_c_raises):
    """A stop signal's handler raises where the process is: mid-write, torch swallowed it
    into its own check, and a DDP run stopped by SIGTERM said "cannot write .../step2.ckpt:
    [enforce fail ...] unexpected pos 30 vs 0" where it should say it was stopped (clean-clone
    CI, twice). The stop is taken once the save is done, and the file removed."""
    class InterruptedFile:
        def __init__(self, file):
            self.file, self.writes = file, 0

        def write(self, data: bytes) -> int:
            self.writes += 1
            if self.writes == 3:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, mid-write
            return self.file.write(data)

        def flush(self) -> None:
            self.file.flush()

    files = []
    keep = WriteErrorKept.__init__
    monkeypatch.setattr(WriteErrorKept, "__init__",
                        lambda self, file: keep(self, files.append(InterruptedFile(file)) or files[-1]))
    with pytest.raises(KeyboardInterrupt):
        save_atomic({"weights": torch.zeros(10_000), "more": torch.ones(10_000)}, tmp_path / "x.ckpt")
    assert files[0].writes > 3  # the save went on to its end: torch saw no failed write
    assert list(tmp_path.iterdir()) == []  # and nothing of it is left
