"""A checkpoint names the run it was trained for (language pair, family, scorer, pieces, model
options), and translate, evaluate, average and resume refuse one of another run in one line;
checkpoints written before the identity was kept load as before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from nmt.cli import main
from nmt.config import load_config, save_config
from nmt.data.tokenizer import Tokenizer, train_tokenizer
from nmt.run_identity import IDENTITY_KEY, run_identity

from .conftest import tiny_train_args, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return folder, write_corpus(folder)


@pytest.fixture(scope="module")
def run(corpus) -> Path:
    """A de->en run that keeps its last 2 checkpoints in steps/."""
    folder, files = corpus
    run_dir = folder / "run"
    assert main([*tiny_train_args(files, run_dir, folder / "data", epochs=2),
                 "trainer.keep_last_checkpoints=2"]) == 0
    return run_dir


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


def _checkpoints(run_dir: Path) -> list[Path]:
    return [run_dir / "best.ckpt", run_dir / "last.ckpt", *sorted((run_dir / "steps").glob("*.ckpt"))]


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n")
    return source


def _other_run(run: Path, corpus, tmp_path: Path, change: str) -> Path:
    """A copy of ``run`` whose config or SentencePiece model is another run's: the run's
    checkpoints dropped into the folder of a run of the same shapes."""
    other = tmp_path / "other"
    shutil.copytree(run, other)
    config = load_config(other / "config.yaml")
    if change == "pair":
        config.data.src_lang, config.data.tgt_lang = config.data.tgt_lang, config.data.src_lang
    elif change == "attention":
        config.model["attention"] = "dot"  # no weights of its own, as scaled_dot
    elif change == "heads":
        config.model["heads"] = 1  # the same weights' shapes, split otherwise
    else:  # as many pieces (the same shapes), learnt from other text
        lines = [line[::-1] for path in corpus[1]["train"]
                 for line in Path(path).read_text(encoding="utf-8").splitlines()]
        tokenizer = train_tokenizer(lines, other / "spm.model", config.data.vocab_size)
        assert len(tokenizer) == len(Tokenizer(run / "spm.model"))
    save_config(config, other / "config.yaml")
    return other


def test_every_checkpoint_training_writes_and_its_average_name_the_run(run, tmp_path):
    identity = run_identity(load_config(run / "config.yaml"), Tokenizer(run / "spm.model"))
    assert identity["pair"] == "de->en" and identity["attention"] == "scaled_dot"
    assert len(_checkpoints(run)) == 4
    for path in _checkpoints(run):
        assert _load(path)[IDENTITY_KEY] == identity, path
    out = tmp_path / "avg.ckpt"
    assert main(["average", "--checkpoint", str(run), "--out", str(out)]) == 0
    assert _load(out)[IDENTITY_KEY] == identity
    assert main(["translate", "--checkpoint", str(run), "--weights", str(out),
                 "--input", str(_source(tmp_path))]) == 0  # its own average: the same run


@pytest.mark.parametrize("change, why", [
    ("pair", "trained de->en, not en->de as "),
    ("attention", "with scaled_dot attention, not dot as "),
    ("pieces", "over another SentencePiece model's pieces than "),
    ("heads", "with other model options than "),  # loaded silently before: " (heads 2, not 1)"
])
def test_checkpoints_copied_into_another_run_are_refused_in_one_line(run, corpus, tmp_path, capsys,
                                                                     change, why):
    """The run's best.ckpt in a folder whose run trained otherwise: translate (the final
    weights and --weights of a kept one), evaluate and average refuse it, exit 1, one line."""
    other = _other_run(run, corpus, tmp_path, change)
    source, out = _source(tmp_path), tmp_path / "out.txt"
    kept = sorted((other / "steps").glob("*.ckpt"))[0]
    commands = [  # the file refused, the command
        (other / "best.ckpt", ["translate", "--checkpoint", str(other), "--input", str(source),
                               "--output", str(out)]),
        (kept, ["translate", "--checkpoint", str(other), "--weights", f"steps/{kept.name}",
                "--input", str(source)]),
        (other / "best.ckpt", ["evaluate", "--checkpoint", str(other), "--split", "test"]),
        (kept, ["average", "--checkpoint", str(other), "--out", str(tmp_path / "a.ckpt")]),
    ]
    for path, argv in commands:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path} is a checkpoint of another run, {why}{other}"), err
        assert change != "heads" or f"{other} (heads 2, not 1): " in err, err
        assert err.count("\n") == 1, err
    assert not out.exists() and not (tmp_path / "a.ckpt").exists()


def test_an_average_given_to_another_run_with_weights_is_refused(run, corpus, tmp_path, capsys):
    """``nmt average --out x.ckpt`` of a de->en run, outside any run, given to an en->de run
    with --weights: its identity travels with it."""
    other = _other_run(run, corpus, tmp_path, "pair")
    average = tmp_path / "avg.ckpt"
    assert main(["average", "--checkpoint", str(run), "--out", str(average)]) == 0
    assert main(["translate", "--checkpoint", str(other), "--weights", str(average),
                 "--input", str(_source(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {average} is a checkpoint of another run, trained de->en, not en->de "
                   f"as {other}: its weights would translate wrongly there; use it with the run "
                   "that trained it\n")


def test_a_folder_of_checkpoints_alone_averages_one_runs_only(run, tmp_path, capsys):
    """Kept checkpoints of two runs gathered in a folder with no config.yaml to name its run:
    each was checked against nothing, and their mean written as if of one model. They must
    agree among themselves now."""
    mixed = tmp_path / "mixed"
    shutil.copytree(run / "steps", mixed / "steps")
    first, second = sorted((mixed / "steps").glob("*.ckpt"))
    checkpoint = _load(second)
    checkpoint[IDENTITY_KEY]["pair"] = "en->de"  # an en->de run's, of the same shapes
    torch.save(checkpoint, second)
    assert main(["average", "--checkpoint", str(mixed)]) == 1
    assert capsys.readouterr().err == (
        f"error: {second} is a checkpoint of another run, trained en->de, not de->en as {first}: "
        "the two runs' weights cannot be averaged; average one run's checkpoints\n")
    assert not (mixed / "averaged.ckpt").exists()
    second.unlink()  # one run's alone: averaged as before
    assert main(["average", "--checkpoint", str(mixed)]) == 0


@pytest.mark.parametrize("foreign", ["last.ckpt", "best.ckpt", "steps"])
def test_a_checkpoint_copied_into_another_run_is_not_resumed(run, corpus, tmp_path, capsys, foreign):
    """An en->de run holding a de->en last.ckpt, best.ckpt or kept checkpoint copied in beside
    its own: the resume checked last.ckpt alone; a best.ckpt copied in it trained on, kept as
    best.ckpt where no validation beat it, named it as the weights to translate with, and
    translate refused it."""
    other = _other_run(run, corpus, tmp_path, "pair")
    copied = other / foreign if foreign != "steps" else sorted((other / "steps").glob("*.ckpt"))[0]
    for path in _checkpoints(other):  # all but the copy are the en->de run's own
        if path != copied:
            checkpoint = _load(path)
            checkpoint[IDENTITY_KEY]["pair"] = "en->de"
            torch.save(checkpoint, path)
    folder, files = corpus
    argv = [*tiny_train_args(files, other, folder / "data", epochs=3),
            "trainer.keep_last_checkpoints=2", "--src-lang", "en", "--tgt-lang", "de"]
    before = (other / "last.ckpt").read_bytes()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {copied} is a checkpoint of another run, trained de->en, not en->de "
                   f"as {other}: its weights would translate wrongly there; use it with the run "
                   "that trained it\n")
    assert (other / "last.ckpt").read_bytes() == before  # nothing trained


def test_checkpoints_from_before_the_identity_load_as_before(run, corpus, tmp_path):
    """An older run's checkpoints hold no identity: translate, average and resume take them
    unchecked, and the resumed run's new checkpoints name the run."""
    old = tmp_path / "old"
    shutil.copytree(run, old)
    (old / "averaged.ckpt").unlink(missing_ok=True)
    for path in _checkpoints(old):
        checkpoint = _load(path)
        del checkpoint[IDENTITY_KEY]
        torch.save(checkpoint, path)
    assert main(["translate", "--checkpoint", str(old), "--input", str(_source(tmp_path))]) == 0
    assert main(["average", "--checkpoint", str(old)]) == 0
    assert IDENTITY_KEY not in _load(old / "averaged.ckpt")  # nothing to carry
    folder, files = corpus
    assert main([*tiny_train_args(files, old, folder / "data", epochs=3),
                 "trainer.keep_last_checkpoints=2"]) == 0
    assert _load(old / "last.ckpt")[IDENTITY_KEY]["pair"] == "de->en"


def test_checkpoints_from_before_the_model_options_were_kept_load_as_before(run, tmp_path):
    """An identity without "model" (written before the model options were kept) is checked
    on the rest: translate takes it, and average takes it beside a newer one of the run."""
    old = tmp_path / "old"
    shutil.copytree(run, old)
    for path in (old / "best.ckpt", sorted((old / "steps").glob("*.ckpt"))[0]):
        checkpoint = _load(path)
        del checkpoint[IDENTITY_KEY]["model"]
        torch.save(checkpoint, path)
    assert main(["translate", "--checkpoint", str(old), "--input", str(_source(tmp_path))]) == 0
    assert main(["average", "--checkpoint", str(old), "--out", str(tmp_path / "avg.ckpt")]) == 0


def test_a_run_with_a_longer_length_limit_reads_its_own_checkpoints(run, tmp_path):
    """model.max_positions raised in a run's config.yaml (to translate longer lines) leaves
    what its weights compute as it was: not another run's model options."""
    longer = tmp_path / "longer"
    shutil.copytree(run, longer)
    config = load_config(longer / "config.yaml")
    config.model["max_positions"] = 2048
    save_config(config, longer / "config.yaml")
    assert main(["translate", "--checkpoint", str(longer), "--input", str(_source(tmp_path))]) == 0
