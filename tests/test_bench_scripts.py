"""The benchmark scripts the README names (scripts/): what they cannot run is one line, as
the command line has it, not a traceback."""

from __future__ import annotations

import runpy
import sys

import pytest

from .conftest import REPO, write_corpus


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


def test_bench_plain_loop_prints_its_results_without_lightnings_end_of_fit(monkeypatch, capfd,
                                                                          tmp_path):
    """bench_plain_loop printed Lightning's "`Trainer.fit` stopped: `max_steps=N` reached."
    (from its measurement of ours, in a child process) among its results."""
    import yaml

    files = write_corpus(tmp_path)
    config = yaml.safe_load((REPO / "configs" / "transformer.yaml").read_text())
    config["data"].update(train_files=files["train"], val_files=files["val"], vocab_size=100,
                          data_dir=str(tmp_path / "data"), max_tokens=600)
    config["model"].update(d_model=32, heads=2, ff_dim=64, encoder_layers=1, decoder_layers=1)
    config["trainer"].update(accelerator="cpu", precision="32-true")
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    assert run_script(monkeypatch, "bench_plain_loop.py", "tiny.yaml", "--steps", "1",
                      "--warmup", "0", "--rounds", "1") is None  # sys.exit(None): success
    out, err = capfd.readouterr()
    assert "tiny.yaml ours:" in out and "| tiny.yaml |" in out
    assert "Trainer.fit" not in out + err and "GPU available" in out + err  # Lightning's other lines stay


def test_bench_sdpa_shapes_says_what_it_does_and_needs(monkeypatch, capsys):
    """bench_sdpa_shapes.py --help printed only "needs a CUDA GPU" (and exited 1) on a machine
    without one: its help now describes it anywhere, and a run without CUDA is one line."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert run_script(monkeypatch, "bench_sdpa_shapes.py", "--help") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "How much a new (batch, length) shape costs torch's fused attention" in out
    assert "Each of 12 shapes" in out
    assert run_script(monkeypatch, "bench_sdpa_shapes.py") == 1
    assert capsys.readouterr().err == ("error: bench_sdpa_shapes.py times torch's fused attention "
                                       "on a CUDA GPU, and torch sees none here\n")


def test_a_learning_curve_of_no_run_is_one_line(monkeypatch, capsys, tmp_path):
    """learning_curve.py of a mistyped run drew an empty learning_curve.png and printed the
    name, as if the run had no validations yet."""
    monkeypatch.chdir(tmp_path)
    assert run_script(monkeypatch, "learning_curve.py", "runs/nope") == 1
    assert capsys.readouterr().err == ("error: runs/nope: no training logs there "
                                       "(logs/version_*/metrics.csv): give a run directory\n")
    assert not (tmp_path / "learning_curve.png").exists()


def test_bench_scoring_memory_scores_both_ways_alike(monkeypatch, capsys, tmp_path):
    """Each way in its own process; the same scores, and a file not found is one line."""
    (tmp_path / "refs.txt").write_text("a dog runs on the grass .\ntwo cats sleep\nthe man waves\n")
    argv = ["--lines", "40", "--file", str(tmp_path / "refs.txt")]
    assert run_script(monkeypatch, "bench_scoring_memory.py", *argv) is None
    rows = capsys.readouterr().out.splitlines()
    assert [row.split(":")[0] for row in rows] == ["40 lines scored at once", "40 lines scored in parts"]
    assert rows[0].split("s, ")[1] == rows[1].split("s, ")[1]  # "BLEU x, chrF y"
    assert run_script(monkeypatch, "bench_scoring_memory.py", "--file", "nope.txt") == 1
    assert capsys.readouterr().err == "error: nope.txt: No such file or directory\n"
