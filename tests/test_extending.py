"""The README's promise, kept: a new scorer or model family is one class plus one registry
entry. The toy family of ``tests.toys``, with the toy scorer as its default, goes through
what a researcher runs: training with kept checkpoints, resuming, translating (greedy, beam,
n-best lists, attention pictures), evaluating, averaging and what ``nmt serve`` says of it."""

from __future__ import annotations

from nmt.cli import main
from nmt.serve.models import model_info

from .conftest import write_corpus
from .toys import toy_config


def test_a_new_family_and_scorer_go_through_every_command(toy_registries, tmp_path, capsys):
    files = write_corpus(tmp_path)
    config, run = toy_config(tmp_path, files), str(tmp_path / "run")
    train = ["train", "--config", config, "--run-dir", run, "trainer.keep_last_checkpoints=2"]
    assert main(train) == 0
    assert main([*train, "--max-epochs", "2"]) == 0  # resumed: one more epoch
    assert "(2 epochs)" in capsys.readouterr().out.splitlines()[-3]
    source = files["test"][0]
    assert main(["translate", "--checkpoint", run, "--input", source, "--beam", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 30 and all(line.strip() for line in lines)
    assert main(["translate", "--checkpoint", run, "--input", source, "--beam", "3", "--nbest",
                 "2", "--plot-attention", str(tmp_path / "pictures")]) == 0
    nbest = capsys.readouterr().out.splitlines()
    assert len(nbest) == 60 and nbest[1].startswith("0 ||| ")
    assert (tmp_path / "pictures" / "0001.png").is_file()
    assert main(["average", "--checkpoint", run, "--last", "2"]) == 0
    assert main(["evaluate", "--checkpoint", run, "--weights", "averaged.ckpt", "--beam", "2"]) == 0
    assert "BLEU = " in capsys.readouterr().out
    info = model_info("run", run, "torch")
    assert (info["family"], info["attention"]) == ("toy", "toy_cosine") and info["parameters"] > 0
