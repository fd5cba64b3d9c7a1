"""Checkpoint averaging: the element-wise mean, the run keeping its last N checkpoints, and
translate / evaluate using the averaged weights."""

from __future__ import annotations

import pytest
import torch

from nmt.average import average_run, step_checkpoints
from nmt.cli import main
from nmt.errors import NMTError

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


def test_checkpoints_of_different_models_are_refused(tmp_path):
    _save(tmp_path / "steps" / "step1.ckpt", {"model.w": torch.zeros(2)})
    _save(tmp_path / "steps" / "step2.ckpt", {"model.v": torch.zeros(2)})
    with pytest.raises(NMTError, match="not the same model"):
        average_run(tmp_path)


def test_a_run_keeps_its_last_checkpoints_and_translates_with_their_average(tmp_path, capsys):
    files = write_corpus(tmp_path)
    run = tmp_path / "run"
    args = tiny_train_args(files, run, tmp_path / "data", epochs=3)
    assert main(args + ["trainer.keep_last_checkpoints=2"]) == 0
    kept = step_checkpoints(run)
    assert len(kept) == 2  # three validations, the oldest checkpoint deleted
    assert main(["average", "--checkpoint", str(run)]) == 0
    assert (run / "averaged.ckpt").is_file()
    assert main(["evaluate", "--checkpoint", str(run), "--weights", "averaged.ckpt",
                 "--beam", "2"]) == 0
    assert (run / "eval" / "test.beam2.averaged.json").is_file()
    capsys.readouterr()
    assert main(["average", "--checkpoint", str(run), "--last", "0"]) == 1
    assert main(["translate", "--checkpoint", str(run), "--weights", "nothing.ckpt"]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "--last" in errors[0] and "nothing.ckpt" in errors[1]


def test_average_of_a_run_without_kept_checkpoints_is_a_one_line_error(tmp_path, capsys):
    assert main(["average", "--checkpoint", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "keep_last_checkpoints" in err
