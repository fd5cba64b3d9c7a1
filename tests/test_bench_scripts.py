"""The benchmark scripts the README names (scripts/): what they cannot run is one line, as
the command line has it, not a traceback."""

from __future__ import annotations

import runpy
import sys

import pytest

from .conftest import REPO


def run_script(monkeypatch, script: str, *argv: str) -> int:
    """``python scripts/<script> ARGV`` in this process; its exit status."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))  # as python puts a script's folder first
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(REPO / "scripts" / script), run_name="__main__")
    return ended.value.code


@pytest.mark.parametrize("script, argv, message", [
    ("bench_plain_loop.py", ["configs/transformer.yaml", "configs/nope.yaml"],
     "config file not found: configs/nope.yaml"),
    ("bench_levers.py", ["configs/nope.yaml"], "config file not found: configs/nope.yaml"),
    ("profile_train.py", ["configs/nope.yaml"], "config file not found: configs/nope.yaml"),
    ("bench_levers.py", ["configs/compare.yaml"], "bad config: Key 'families' not in 'Config'"),
    ("bench_beam_pruning.py", ["no_such_run"], "checkpoint directory not found: no_such_run"),
])
def test_what_a_script_cannot_run_is_one_line(monkeypatch, capsys, script, argv, message):
    """A config or run directory not found ended these scripts in an NMTError traceback
    (bench_plain_loop's from its worker process, after the configs before it had run)."""
    monkeypatch.chdir(REPO)
    assert run_script(monkeypatch, script, *argv) == 1
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("script, argv, option", [
    ("bench_plain_loop.py", ["configs/transformer.yaml", "--steps", "0"], "--steps"),
    ("bench_plain_loop.py", ["configs/transformer.yaml", "--rounds", "0"], "--rounds"),
    ("bench_levers.py", ["configs/transformer.yaml", "--steps", "0"], "--steps"),
    ("profile_train.py", ["configs/transformer.yaml", "--steps", "0"], "--steps"),
])
def test_a_count_of_nothing_is_refused_before_any_work(monkeypatch, capsys, script, argv, option):
    """bench_plain_loop --steps 0 measured for minutes, then divided by zero (a traceback)."""
    monkeypatch.chdir(REPO)
    assert run_script(monkeypatch, script, *argv) == 2
    assert f"argument {option}: must be a whole number >= 1, got '0'" in capsys.readouterr().err


def test_a_learning_curve_of_no_run_is_one_line(monkeypatch, capsys, tmp_path):
    """learning_curve.py of a mistyped run drew an empty learning_curve.png and printed the
    name, as if the run had no validations yet."""
    monkeypatch.chdir(tmp_path)
    assert run_script(monkeypatch, "learning_curve.py", "runs/nope") == 1
    assert capsys.readouterr().err == ("error: runs/nope: no training logs there "
                                       "(logs/version_*/metrics.csv): give a run directory\n")
    assert not (tmp_path / "learning_curve.png").exists()
