"""End to end through the command line: train -> translate -> evaluate on a tiny run,
resume after interruption, DDP on two CPU processes, and bad input."""

from __future__ import annotations

import argparse
import codecs
import csv
import gzip
import io
import json
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sacrebleu
import torch
import yaml

import nmt.engines
import nmt.trainer
import nmt.translator
from nmt.cli import main, parser
from nmt.cli.decoding import input_chunks, open_input
from nmt.config import load_config, save_config
from nmt.data.batching import TokenBatchSampler
from nmt.data.module import prepare_data, split_dataset
from nmt.errors import NMTError, Stopped, stopped_cleanly
from nmt.provenance import code_commit
from nmt.translator import check_run_weights

from .conftest import REPO, tiny_train_args, write_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    return folder, write_corpus(folder)


@pytest.fixture(scope="module")
def run(corpus):
    folder, files = corpus
    run_dir = folder / "run"
    assert main(tiny_train_args(files, run_dir, folder / "data", epochs=2)) == 0
    return run_dir


def test_run_directory_is_self_contained(run):
    for name in ("best.ckpt", "last.ckpt", "config.yaml", "spm.model", "logs/version_0/metrics.csv"):
        assert (run / name).is_file(), name
    assert not list(run.glob(".*tmp*")), "temporary checkpoint files left behind"
    metrics = (run / "logs" / "version_0" / "metrics.csv").read_text()
    assert "val_bleu" in metrics and "val_loss" in metrics and "train_loss" in metrics


def test_tensorboard_logs_what_the_csv_logs(corpus, tmp_path, monkeypatch, capsys):
    """trainer.tensorboard=true writes RUN/tensorboard/version_0/ events holding the losses and
    every validation of metrics.csv; without TensorBoard installed, a one-line error."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, files = corpus
    run_dir = tmp_path / "tb"
    assert main(tiny_train_args(files, run_dir, folder / "data") + ["trainer.tensorboard=true"]) == 0
    events = EventAccumulator(str(run_dir / "tensorboard" / "version_0"))
    events.Reload()
    assert {"train_loss", "val_loss", "val_bleu", "lr"} <= set(events.Tags()["scalars"])
    with open(run_dir / "logs" / "version_0" / "metrics.csv") as f:
        csv_losses = [float(row["val_loss"]) for row in csv.DictReader(f) if row["val_loss"]]
    assert [e.value for e in events.Scalars("val_loss")] == pytest.approx(csv_losses)
    capsys.readouterr()

    import lightning.fabric.loggers.tensorboard as lightning_tensorboard

    monkeypatch.setattr(lightning_tensorboard, "_TENSORBOARD_AVAILABLE", False)
    monkeypatch.setattr(lightning_tensorboard, "_TENSORBOARDX_AVAILABLE", False)
    assert main(tiny_train_args(files, tmp_path / "no_tb", folder / "data")
                + ["trainer.tensorboard=true"]) == 1
    err = capsys.readouterr().err
    assert 'trainer.tensorboard needs TensorBoard: pip install -e ".[tensorboard]"' in err
    assert err.count("\n") == 1 and not list((tmp_path / "no_tb").glob("**/*.ckpt"))


def test_translate_keeps_order_and_empty_lines(run, tmp_path, capsys):
    lines = ["haus mann", "", "katze blau im park", "hund"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--output", str(out), "--beam", "3"]) == 0
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == 4 and got[1] == ""
    # Same lines one at a time give the same translations (sorted batching restores order).
    for line, expected in zip(lines, got):
        source.write_text(line + "\n", encoding="utf-8")
        assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "3"]) == 0
        assert capsys.readouterr().out == expected + "\n"


def test_translate_nbest_format(run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("haus mann\nhund\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--beam", "4", "--nbest", "3"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 6 and [r.split(" ||| ")[0] for r in rows] == ["0"] * 3 + ["1"] * 3


def test_translate_alignment_pairs_every_target_word_with_a_source_word(run, tmp_path, capsys):
    """--alignment: each row is the translation, " ||| ", then one i-j pair per target word in
    target order (i a word of the source line, j of the translation), the translation as
    translate writes it without the flag; an empty line has none. The pairs' choice itself:
    tests/test_alignment.py."""
    lines = ["haus mann katze", "", "hund blau im park"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = ["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "2",
               "--precision", "32-true"]
    assert main(command) == 0
    plain = capsys.readouterr().out.splitlines()
    assert main([*command, "--alignment"]) == 0
    rows = [row.split(" ||| ") for row in capsys.readouterr().out.splitlines()]
    assert [text for text, _ in rows] == plain
    for line, (text, pairs) in zip(lines, rows):
        pairs = [tuple(map(int, pair.split("-"))) for pair in pairs.split()]
        assert [j for _, j in pairs] == list(range(len(text.split())))
        assert all(0 <= i < len(line.split()) for i, _ in pairs)
    assert rows[1] == ["", ""]
    for extra, message in ((["--nbest", "2"], "--alignment is written beside the best translation"),
                           (["--ensemble", str(run)], "--alignment reads one model's attention")):
        assert main([*command, "--alignment", *extra]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_translate_in_chunks_writes_what_the_whole_input_gives(run, tmp_path, capsys):
    """--buffer-lines cuts the input into chunks translated one after the other: the output,
    the n-best ids, the warnings' line numbers and the pictures' names count the whole input.
    (Scores may move in their last digits with the batch a sentence is decoded in.)"""
    lines = ["haus mann", "", " ".join(["haus"] * 600), "katze blau im park", "hund"]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    runs = {}
    for buffer in ("1", "2", "10000"):
        for extra in ([], ["--nbest", "2"]):
            assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam",
                         "2", "--precision", "32-true", "--buffer-lines", buffer, *extra]) == 0
            captured = capsys.readouterr()
            rows = [row.split(" ||| ")[:2] for row in captured.out.splitlines()]  # id, text
            runs.setdefault(buffer, []).append((rows, captured.err))
    assert runs["1"] == runs["2"] == runs["10000"]
    (single, err), (nbest, _) = runs["1"]
    assert len(single) == 5 and "warning: line 3 has" in err
    assert [row[0] for row in nbest] == ["0", "0", "1", "2", "2", "3", "3", "4", "4"]
    source.write_text("haus mann\n\nhund\n", encoding="utf-8")  # short lines: quick pictures
    for buffer in ("1", "10000"):
        pictures = tmp_path / f"pictures{buffer}"
        assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                     "--buffer-lines", buffer, "--plot-attention", str(pictures)]) == 0
        assert sorted(p.name for p in pictures.iterdir()) == ["0001.png", "0003.png"]
    # Pictures of an earlier input would stand beside this one's as if they were its own.
    capsys.readouterr()
    source.write_text("hund\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--plot-attention", str(pictures)]) == 1
    assert capsys.readouterr().err == (f"error: --plot-attention {pictures} holds pictures of an "
                                       "earlier input (0001.png, ...): name a new folder, or "
                                       "empty this one\n")
    assert sorted(p.name for p in pictures.iterdir()) == ["0001.png", "0003.png"]


def test_translate_that_fails_part_of_the_way_leaves_no_pictures_beside_no_output(run, tmp_path,
                                                                                   capsys):
    """--plot-attention with --output FILE: an input that fails on line 3 (not UTF-8) wrote no
    output but left the first lines' pictures, and the same command run again on the mended
    input refused the folder as holding an earlier input's pictures. They go now, with the
    folders made for them; what else a folder held stays. Translations written to stdout as
    they come keep their pictures (an interactive session ended with Ctrl-C, say)."""
    source = tmp_path / "in.txt"
    source.write_bytes(b"haus mann\nhund\nkaputt \xff\n")
    new, kept = tmp_path / "new" / "pictures", tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    command = ["translate", "--checkpoint", str(run), "--input", str(source), "--buffer-lines", "1"]
    for folder in (new, kept):
        out = tmp_path / "out.en"
        assert main([*command, "--output", str(out), "--plot-attention", str(folder)]) == 1
        assert capsys.readouterr().err.endswith("line 3: not valid UTF-8 (byte 7 of the line)\n")
        assert not out.exists()
    assert not (tmp_path / "new").exists()
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]
    source.write_bytes(b"haus mann\nhund\n")
    assert main([*command, "--output", str(out), "--plot-attention", str(kept)]) == 0
    assert sorted(p.name for p in kept.iterdir()) == ["0001.png", "0002.png", "notes.txt"]
    source.write_bytes(b"haus mann\nkaputt \xff\n")
    assert main([*command, "--plot-attention", str(new)]) == 1  # to stdout
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert [p.name for p in new.iterdir()] == ["0001.png"]


def test_translate_streams_each_line_as_it_arrives(run):
    """--buffer-lines 1 from a pipe: each translation comes out before the next line goes in,
    as for a program that talks to ``nmt translate`` (stdout a pipe, block-buffered: only
    our flush sends it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    child = subprocess.Popen([sys.executable, "-m", "nmt", "translate", "--checkpoint", str(run),
                              "--beam", "1", "--buffer-lines", "1"], cwd=REPO, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**env, "HF_HUB_OFFLINE": "1"})
    try:
        answers = []
        for line in ("haus mann", "hund"):
            child.stdin.write(line + "\n")
            child.stdin.flush()
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready, f"no answer to {line!r} within 60 s while its input stays open"
            answers.append(child.stdout.readline())
        child.stdin.close()
        assert child.wait(timeout=60) == 0 and child.stdout.read() == ""
    finally:
        child.kill()
    assert len(answers) == 2 and all(answer.endswith("\n") for answer in answers)


def test_a_reader_that_goes_away_ends_translate_quietly(run, tmp_path):
    """``nmt translate ... | head -1``: the closed pipe ends the command as it ends Unix tools,
    without a message."""
    source = tmp_path / "in.txt"
    source.write_text("haus mann\nhund\n" * 20, encoding="utf-8")
    done = subprocess.run(f"{sys.executable} -m nmt translate --checkpoint {run} --input {source}"
                          " --beam 1 --buffer-lines 1 | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 1
    assert "rror" not in done.stderr and "Exception" not in done.stderr, done.stderr


def test_an_error_part_of_the_way_leaves_the_output_file_as_it_was(run, tmp_path, capsys):
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(b"haus\nhund\nkatze \xff\n")
    out.write_text("an earlier translation\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--output",
                 str(out), "--buffer-lines", "1", "--beam", "1"]) == 1
    assert f"{source}, line 3: not valid UTF-8" in capsys.readouterr().err
    assert out.read_text() == "an earlier translation\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temporary file
    # A missing input is found before the output's folder is made.
    assert main(["translate", "--checkpoint", str(run), "--input", str(tmp_path / "missing"),
                 "--output", str(tmp_path / "new" / "out.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_very_long_line_is_truncated_with_warning(run, tmp_path, capsys):
    source = tmp_path / "long.txt"
    source.write_text(" ".join(["haus"] * 600) + "\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "1"]) == 0
    captured = capsys.readouterr()
    assert "line 1" in captured.err and "truncated" in captured.err
    assert len(captured.out.splitlines()) == 1


def test_evaluate_writes_scores(corpus, run, capsys):
    assert main(["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "nrefs:1" in out and "chrF" in out
    scores = json.loads((run / "eval" / "test.beam2.json").read_text())
    hyps = (run / "eval" / "test.beam2.hyp").read_text(encoding="utf-8").splitlines()
    refs = Path(corpus[1]["test"][1]).read_text(encoding="utf-8").splitlines()
    assert scores["sentences"] == len(hyps) == len(refs) == 30
    # The scores are those of the written translations against the references, in order.
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=0.006)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=0.006)
    assert scores["prune_margin"] == 3.0  # the decoding config's default
    assert scores["alpha"] == yaml.safe_load((run / "config.yaml").read_text())["decoding"]["alpha"]


def test_evaluate_says_what_it_cannot_score_before_loading_the_model(run, tmp_path, monkeypatch,
                                                                     capsys):
    """A split the corpus lacks (evaluate's default, test, of a run trained on named files
    without data.test_files) or a missing --files file was an error only after the model was
    loaded and --precision auto had timed bf16 against fp32 (seconds, minutes for a large
    model on a CPU). The text is read first now."""
    def load_translator(*args, **kwargs):
        raise AssertionError("the model was loaded before the text was read")

    monkeypatch.setattr(nmt.engines, "load_translator", load_translator)
    for options, message in ((["--split", "dev"], "split 'dev' not in the corpus"),
                             (["--files", str(tmp_path / "nope.de"), str(tmp_path / "nope.en")],
                              "--files: no such file")):
        assert main(["evaluate", "--checkpoint", str(run), *options]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def test_evaluate_says_where_it_cannot_write_before_decoding(run, tmp_path, monkeypatch, capsys):
    """RUN/eval/ that could not be made or written (here a file of that name; a run read-only
    to its user, a read-only mount) was an error only after the whole split was decoded
    (minutes for a large test set): the files are made first now, and nothing is decoded.
    Stopped while it decodes, it leaves no file behind."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("eval"))
    (copy / "eval").write_text("not a folder\n")
    decoded = []

    def translate(self, lines, *args, **kwargs):
        decoded.append(lines)
        return [[nmt.translator.Translation("", 0.0, [])] for _ in lines]

    monkeypatch.setattr(nmt.translator.Translator, "translate", translate)
    assert main(["evaluate", "--checkpoint", str(copy), "--beam", "2"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: cannot write {copy}/eval/test.beam2.hyp: {copy}/eval is a file, not a folder\n"
    assert not decoded

    (copy / "eval").unlink()

    def stopped(self, lines, *args, **kwargs):
        assert [p.name for p in (copy / "eval").iterdir()] != [], "nothing made before decoding"
        raise KeyboardInterrupt

    monkeypatch.setattr(nmt.translator.Translator, "translate", stopped)
    assert main(["evaluate", "--checkpoint", str(copy), "--beam", "2"]) == 130
    assert not (copy / "eval").exists()


def test_evaluate_on_files_of_ones_own(corpus, run, tmp_path, capsys):
    """--files SRC REF scores any test set, read as a corpus' files are: the run's test files
    (one gzipped) score what --split test does, under their own name; bad files are one line."""
    _, files = corpus
    source, reference = files["test"]
    packed = tmp_path / "ref.gz"
    packed.write_bytes(gzip.compress(Path(reference).read_bytes()))
    assert main(["evaluate", "--checkpoint", str(run), "--beam", "2"]) == 0
    split_scores = json.loads((run / "eval" / "test.beam2.json").read_text())
    assert main(["evaluate", "--checkpoint", str(run), "--beam", "2", "--files", source, str(packed)]) == 0
    written = list((run / "eval").glob("test.src-*.beam2.json"))
    assert len(written) == 1
    scores = json.loads(written[0].read_text())
    assert scores["files"] == [str(Path(source).resolve()), str(packed.resolve())]
    assert "split" not in scores and scores["bleu"] == split_scores["bleu"]
    assert (run / "eval" / "test.beam2.json").read_text() == json.dumps(split_scores, indent=2) + "\n"
    short = tmp_path / "short.txt"
    short.write_text("one\n")
    fifo = tmp_path / "fifo"  # what a shell's process substitution names
    os.mkfifo(fifo)
    for options, message in ((["--split", "val", "--files", source, reference], "give one"),
                             (["--files", source, str(tmp_path / "nope")], "--files: no such file"),
                             (["--files", source, str(fifo)], "is not a regular file"),  # <(...)
                             (["--files", source, str(tmp_path)], f"{tmp_path} is a folder"),
                             (["--files", source, str(short)], "has 30 lines but")):
        capsys.readouterr()
        assert main(["evaluate", "--checkpoint", str(run), *options]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1


def spy_on_beam_search(monkeypatch) -> list[dict]:
    """The alpha and prune margin of every beam search the translator runs from now on."""
    calls, search = [], nmt.translator.beam_search

    def recorded(model, src, mask, beam_size, alpha, max_len_ratio, nbest, need_attn, margin):
        calls.append({"alpha": alpha, "prune_margin": margin})
        return search(model, src, mask, beam_size, alpha, max_len_ratio, nbest, need_attn, margin)

    monkeypatch.setattr(nmt.translator, "beam_search", recorded)
    return calls


def test_evaluate_with_another_alpha_keeps_both_results(run, monkeypatch, capsys):
    """--alpha A writes <split>.beam<k>.alphaA.{hyp,json} beside the default's, which it leaves
    as they were, records the length penalty it decoded with, and names the files it wrote
    (it said "written to RUN/eval/", which holds one pair of files per option given)."""
    args = ["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "2"]
    assert main(args) == 0
    default = (run / "eval" / "test.beam2.json").read_text()
    searches = spy_on_beam_search(monkeypatch)  # the config's alpha is 1.4
    capsys.readouterr()
    assert main([*args, "--alpha", "0.3"]) == 0
    assert capsys.readouterr().out.endswith(
        f"hypotheses and scores written to {run / 'eval' / 'test.beam2.alpha0.3'}.{{hyp,json}}\n")
    assert searches and all(call["alpha"] == 0.3 for call in searches)  # decoded with it
    scores = json.loads((run / "eval" / "test.beam2.alpha0.3.json").read_text())
    assert scores["alpha"] == 0.3 and scores["sentences"] == 30
    assert len((run / "eval" / "test.beam2.alpha0.3.hyp").read_text().splitlines()) == 30
    assert (run / "eval" / "test.beam2.json").read_text() == default


def test_evaluate_with_a_prune_margin_keeps_both_results(run, capsys, monkeypatch):
    """--prune-margin none (the full beam) writes its own files beside the default's, and
    records the margin; a margin that is not a number is a one-line error."""
    args = ["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "2"]
    assert main(args) == 0
    default = (run / "eval" / "test.beam2.json").read_text()
    searches = spy_on_beam_search(monkeypatch)
    assert main([*args, "--prune-margin", "none"]) == 0
    assert searches and all(call["prune_margin"] is None for call in searches)  # the full beam
    scores = json.loads((run / "eval" / "test.beam2.prune-none.json").read_text())
    assert scores["prune_margin"] is None and scores["sentences"] == 30
    assert (run / "eval" / "test.beam2.json").read_text() == default
    assert main([*args, "--prune-margin", "2.50"]) == 0
    assert json.loads((run / "eval" / "test.beam2.prune-2.5.json").read_text())["prune_margin"] == 2.5
    for bad in ("wide", "-1"):
        capsys.readouterr()
        assert main([*args, "--prune-margin", bad]) == 1
        err = capsys.readouterr().err
        assert "--prune-margin must be a number >= 0 or none" in err and err.count("\n") == 1


def test_greedy_evaluation_names_and_records_no_unused_option(run):
    """evaluate --beam 1 --alpha 0.3 wrote test.beam1.alpha0.3.* beside test.beam1.*, the same
    translations under another name, and every greedy JSON recorded a length penalty (and a
    prune margin) that greedy search never uses: both are left out of greedy names and JSON."""
    args = ["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "1"]
    assert main(args) == 0
    default = (run / "eval" / "test.beam1.hyp").read_text()
    assert main([*args, "--alpha", "0.3", "--prune-margin", "none"]) == 0
    assert sorted(p.name for p in (run / "eval").glob("test.beam1*")) == ["test.beam1.hyp",
                                                                          "test.beam1.json"]
    assert (run / "eval" / "test.beam1.hyp").read_text() == default
    scores = json.loads((run / "eval" / "test.beam1.json").read_text())
    assert "alpha" not in scores and "prune_margin" not in scores and scores["beam"] == 1


def test_options_given_at_the_runs_own_values_name_no_files_of_their_own(run, capsys):
    """evaluate --alpha 1.4 --precision 32-true --prune-margin 3, the run's own decoding options,
    wrote test.beam2.alpha1.4.32-true.prune-3.*, the default's translations under another name:
    an option names files only where it is not the run's own."""
    args = ["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "2"]
    assert main(args) == 0
    before = sorted(p.name for p in (run / "eval").iterdir())
    default = (run / "eval" / "test.beam2.hyp").read_text()
    assert main([*args, "--alpha", "1.4", "--precision", "32-true", "--prune-margin", "3"]) == 0
    assert sorted(p.name for p in (run / "eval").iterdir()) == before
    assert (run / "eval" / "test.beam2.hyp").read_text() == default
    capsys.readouterr()
    assert main([*args, "--alpha", "1.4", "--prune-margin", "none"]) == 0  # one not its own
    assert capsys.readouterr().out.endswith(
        f"written to {run / 'eval' / 'test.beam2.prune-none'}.{{hyp,json}}\n")


def test_evaluate_on_a_device_asked_for_keeps_both_results_and_names_the_device(run):
    """evaluate --device cpu and then --device cuda wrote the same files, each replacing the
    other's, and no JSON said where it was decoded: --device gets its own files beside the
    default's (cpu; cuda:1 as cuda1), and every JSON names the device and its model."""
    args = ["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "2"]
    assert main(args) == 0
    default = (run / "eval" / "test.beam2.json").read_text()
    assert main([*args, "--device", "cpu"]) == 0
    assert (run / "eval" / "test.beam2.json").read_text() == default
    for scores in (json.loads(default), json.loads((run / "eval" / "test.beam2.cpu.json").read_text())):
        assert scores["device"] == "cpu" and scores["device_name"].startswith("CPU: ")
        assert scores["precision"] == "32-true" and scores["sentences"] == 30
    assert len((run / "eval" / "test.beam2.cpu.hyp").read_text().splitlines()) == 30


@pytest.mark.parametrize("argv,message", [
    (["translate", "--checkpoint", "/nonexistent/run"], "checkpoint directory not found"),
    (["evaluate", "--checkpoint", "/nonexistent/run"], "checkpoint directory not found"),
    (["translate", "--checkpoint", "README.md"], "is a file: --checkpoint takes the run directory"),
    (["average", "--checkpoint", "README.md"], "is a file: --checkpoint takes the run directory"),
    # serve said "not a training run directory", and the hint left export's --weights out
    (["serve", "--checkpoint", "configs/transformer.yaml"],
     "configs/transformer.yaml is a file: --checkpoint takes the run directory (configs); translate, "
     "evaluate, serve and export take a checkpoint file in it with --weights (transformer.yaml)"),
    (["export", "--checkpoint", "README.md", "--out", "x.ct2"],
     "is a file: --checkpoint takes the run directory (.); translate, evaluate, serve and export"),
    (["train", "--config", "/nonexistent.yaml"], "config file not found"),
    (["train", "--config", "configs/transformer.yaml", "--trainer.max_epoch", "3"], "max_epoch"),
    (["train", "--config", "configs/transformer.yaml", "--attention", "cosine"], "scaled_dot"),
    (["train", "--config", "configs/rnn_bahdanau.yaml", "--model.hiden_size", "3"], "hiden_size"),
    (["train", "--config", "configs/transformer.yaml", "--model.family", "cnn"], "rnn, transformer"),
    (["train", "--config", "configs/transformer.yaml", "--max-time", "ten"], "HH:MM:SS"),
    # values Lightning, torch or numpy would refuse in a traceback, or take without a word
    (["train", "--config", "configs/transformer.yaml", "--max-time", "00:00:00"], "trains nothing"),
    (["train", "--config", "configs/transformer.yaml", "optim.weight_decay=-1"], "optim.weight_decay"),
    (["train", "--config", "configs/transformer.yaml", "optim.plateau_factor=5"], "plateau_factor"),
    (["train", "--config", "configs/transformer.yaml", "optim.min_lr=-1"], "optim.min_lr"),
    (["train", "--config", "configs/transformer.yaml", "optim.min_lr=.nan"], "optim.min_lr"),
    # cosine rose from the peak to 10x it; plateau never lowered the rate
    (["train", "--config", "configs/transformer.yaml", "optim.lr=0.001", "optim.min_lr=0.01"],
     "optim.min_lr 0.01 is above optim.lr 0.001: the cosine schedule would rise to it"),
    (["train", "--config", "configs/rnn_bahdanau.yaml", "optim.schedule=plateau",
      "optim.lr=1e-7"], "optim.min_lr 1e-06 is above optim.lr 1e-07: the plateau schedule would never lower"),
    # both validated after every batch; a negative interval logged every step
    (["train", "--config", "configs/transformer.yaml", "trainer.val_check_interval=true"],
     "trainer.val_check_interval True: give a number of batches"),
    (["train", "--config", "configs/transformer.yaml", "trainer.val_check_interval=00:00:00:00"],
     "a time DD:HH:MM:SS above 0"),
    (["train", "--config", "configs/transformer.yaml", "trainer.val_check_interval=-1:00:00:00"],
     "a time DD:HH:MM:SS above 0"),
    (["train", "--config", "configs/transformer.yaml", "trainer.val_check_interval={{minutes: 0}}"],
     "a time DD:HH:MM:SS above 0"),
    (["train", "--config", "configs/transformer.yaml", "trainer.log_every_n_steps=-1"],
     "trainer.log_every_n_steps must be 0 or more, got -1"),
    (["train", "--config", "configs/transformer.yaml", "optim.lr=.inf"], "optim.lr"),
    (["train", "--config", "configs/transformer.yaml", "optim.ema_decay=1"], "optim.ema_decay"),
    (["train", "--config", "configs/transformer.yaml", "trainer.gradient_clip_val=.nan"],
     "trainer.gradient_clip_val"),
    (["train", "--config", "configs/transformer.yaml", "trainer.keep_last_checkpoints=-1"],
     "trainer.keep_last_checkpoints"),
    (["train", "--config", "configs/transformer.yaml", "--seed", "4294967296"], "seed must be from 0"),
    (["train", "--config", "configs/transformer.yaml", "decoding.alpha=.nan"], "decoding: the length"),
    (["train", "--config", "configs/transformer.yaml", "decoding.alpha=-0.5"],
     "decoding: the length penalty alpha must be from 0 (none) to 10, got -0.5"),
    (["train", "--config", "configs/transformer.yaml", "decoding.nbest=9"], "decoding: need beam"),
    (["train", "--config", "configs/transformer.yaml", "decoding.prune_margin=-1"], "prune margin"),
    (["train", "--config", "configs/transformer.yaml", "decoding.precision=foo"], "decoding.precision"),
    (["bench", "attention", "--max-len", "8"], "--max-len must be at least 32"),
    (["average", "--checkpoint", "{export}"], "is a CTranslate2 export: nmt average takes a training run"),
    (["average", "--checkpoint", "docs"], "no config.yaml in docs: is it a training run directory?"),
])
def test_bad_input_gives_one_line_error(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    (tmp_path / "model.bin").write_bytes(b"")  # what marks a CTranslate2 export
    assert main([arg.format(export=tmp_path) for arg in argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv,message", [
    # argparse took an abbreviation as the option it starts: a silent --max-epochs 3
    (["train", "--config", "configs/transformer.yaml", "--max-epoch", "3"],
     "unknown option --max-epoch: did you mean --max-epochs?"),
    (["translate", "--checkpoint", "README.md", "--bea", "5"], "unrecognized arguments: --bea 5"),
    (["train", "--config", "configs/transformer.yaml", "-x"], "cannot read option '-x'"),
    # the shell's way of giving a list, where a config list is one value
    (["train", "--config", "configs/transformer.yaml", "--data.train_files", "a.de", "a.en"],
     "--data.train_files takes one value; write a list as one, --data.train_files='[a.de,a.en]'"),
    (["train", "--config", "configs/transformer.yaml", "--trainer.max_epochs", "3", "4"],
     "cannot read option '4'; use --section.key VALUE"),
])
def test_a_command_line_the_parser_cannot_take_exits_2(argv, message, capsys, monkeypatch):
    """Status 2, as argparse's own refusals (a missing or malformed argument): a script tells a
    wrong command line from a run that failed (1) by it."""
    monkeypatch.chdir(REPO)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv,flag", [
    (["compare", "--seeds", "0"], "--seeds"),
    (["bench", "train", "--config", "c.yaml", "--steps", "0"], "--steps"),
    (["bench", "data", "--pairs", "-5"], "--pairs"),
    (["bench", "decode", "--checkpoint", "run", "--beam", "1,x"], "--beam"),
    (["bench", "decode", "--checkpoint", "run", "--limit", "0"], "--limit"),
    (["bench", "decode", "--checkpoint", "run", "--repeat", "0"], "--repeat"),
    (["compare", "--jobs", "0"], "--jobs"),
])
def test_counts_below_one_are_refused_by_the_parser(argv, flag, capsys):
    """A count of 0 would fall back to a default (--seeds) or divide by zero (--steps)."""
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_known_args(argv)
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [
    # not stdin or stdout; not the current folder, where pictures 0001.png ... went
    (["translate", "--checkpoint", "run", "--input", ""], "--input"),
    (["translate", "--checkpoint", "run", "--output", ""], "--output"),
    (["translate", "--checkpoint", "run", "--plot-attention", ""], "--plot-attention"),
    # "." exists and is not a CTranslate2 export; "no config.yaml in ."
    (["export", "--checkpoint", "run", "--out", ""], "--out"),
    (["export", "--checkpoint", "", "--out", "x.ct2"], "--checkpoint"),
    (["translate", "--checkpoint", "run", "--weights", ""], "--weights"),  # "not found: run"
    (["evaluate", "--checkpoint", "run", "--ensemble", "run2", ""], "--ensemble"),
    (["evaluate", "--checkpoint", "run", "--files", "", "ref"], "--files"),
    # the default's: RUN/averaged.ckpt, checkpoints/<name>..., study/<preset>, the config
    (["average", "--checkpoint", "run", "--out", ""], "--out"),
    (["train", "--config", "c.yaml", "--run-dir", ""], "--run-dir"),
    (["compare", "--out", ""], "--out"),
    (["compare", "--runs", ""], "--runs"),
    (["compare", "--config", ""], "--config"),
    (["serve", "--checkpoint", ""], "--checkpoint"),
    (["bench", "data", "--dir", ""], "--dir"),
])
def test_an_empty_path_is_refused_by_the_parser(argv, flag, capsys):
    """An empty file or folder option (an unset shell variable) read as the current folder,
    stdin or stdout, or the option's default: a misleading error, or work written elsewhere."""
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_known_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: is empty (an unset variable?): name a file or folder" in err, err
    assert err.count("\n") == 1


def test_warm_up_steps_may_be_none_but_not_fewer():
    args, _ = parser().parse_known_args(["bench", "train", "--config", "c.yaml", "--warmup", "0"])
    assert args.warmup == 0
    with pytest.raises(SystemExit):
        parser().parse_known_args(["bench", "train", "--config", "c.yaml", "--warmup", "-1"])


def test_bench_decode_beams_are_parsed_into_sizes():
    args, _ = parser().parse_known_args(["bench", "decode", "--checkpoint", "run"])
    assert args.beam == [1, 5]
    args, _ = parser().parse_known_args(["bench", "decode", "--checkpoint", "run", "--beam", "3"])
    assert args.beam == [3]


def _leaf_parsers(node: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of every command that runs something, e.g. (("bench", "train"), p)."""
    subcommands = [a for a in node._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, node
        return
    for name, child in subcommands[0].choices.items():
        yield from _leaf_parsers(child, (*path, name))


def test_every_command_runs_its_own_function():
    """No command falls through to another's: each parser names cmd_<its words>."""
    leaves = dict(_leaf_parsers(parser()))
    assert len(leaves) == 12 and ("bench", "attention") in leaves
    for words, command_parser in leaves.items():
        assert command_parser.get_default("run_command").__name__ == "cmd_" + "_".join(words)


def test_an_os_error_is_one_line(monkeypatch, capsys):
    """An OSError that no command turned into a message still ends in one line, no traceback."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/runs/x/averaged.ckpt")

    monkeypatch.setattr("nmt.average.average_run", refuse)
    assert main(["average", "--checkpoint", "/runs/x"]) == 1
    assert capsys.readouterr().err == "error: /runs/x/averaged.ckpt: Permission denied\n"


def test_a_byte_order_mark_is_not_text(tmp_path):
    """A file saved with a UTF-8 byte-order mark (Windows editors write one): a reference's
    first line kept it, and a perfect translation then scored BLEU 69 on two lines, not 100."""
    from nmt.data.corpus import read_pairs
    from nmt.metrics import score_corpus

    bom = codecs.BOM_UTF8
    (tmp_path / "src").write_bytes(bom + b"ein Hund l\xc3\xa4uft .\nzwei Katzen .\n")
    (tmp_path / "ref").write_bytes(bom + b"a dog runs .\ntwo cats .\n")
    src, ref = next(read_pairs((str(tmp_path / "src"), str(tmp_path / "ref"))))
    assert src == ["ein Hund läuft .", "zwei Katzen ."] and ref == ["a dog runs .", "two cats ."]
    assert score_corpus(["a dog runs .", "two cats ."], ref)["bleu"] == 100.0
    with open(tmp_path / "src", "rb") as stream:  # translate's input
        assert list(input_chunks(stream, 10)) == [["ein Hund läuft .", "zwei Katzen ."]]
    # One \r before the \n is a Windows line end, dropped; another is the line's own, as in
    # training's files (where it is an error), not a second line end to drop silently
    (tmp_path / "src").write_bytes(b"haus\r\nhund\r\r\n\r\n")
    with open(tmp_path / "src", "rb") as stream:
        assert list(input_chunks(stream, 10)) == [["haus", "hund\r", ""]]


def test_input_may_be_a_pipe(tmp_path):
    """--input /dev/stdin or <(zcat f.gz) is a pipe, not a regular file: read it all the same."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    writer = threading.Thread(target=pipe.write_bytes, args=(b"haus\nhund\n",), daemon=True)
    writer.start()
    with open_input(str(pipe)) as stream:
        assert list(input_chunks(stream, 10)) == [["haus", "hund"]]
    writer.join(5)
    with pytest.raises(NMTError, match=f"cannot read {tmp_path}/missing.txt: No such file"):
        open_input(str(tmp_path / "missing.txt"))
    # A read that fails part of the way (here: the first) names the input, not the output.
    with open_input("/proc/self/mem") as stream, \
            pytest.raises(NMTError, match="cannot read /proc/self/mem: Input/output error"):
        list(input_chunks(stream, 10, "/proc/self/mem"))


def test_help_names_every_scorer(capsys, monkeypatch):
    """From the registry: a scorer added there is named by --help (a list of names kept
    beside it for the help had to be edited too)."""
    from nmt.attention import SCORERS, GeneralScorer

    monkeypatch.setitem(SCORERS, "bilinear", GeneralScorer)  # a researcher's new entry
    for command in (["train"], ["bench", "train"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps the line
        assert f"--attention ATTENTION {' | '.join(SCORERS)}" in help_text
        assert help_text.count("bilinear") == 1


def test_parsing_the_command_line_imports_no_torch():
    """Parsing (and so every one-line refusal of a bad option) stays quick: torch is imported
    by the commands that need it (it had come in through nmt.files, ~1 s)."""
    check = ("import sys; from nmt.cli import parser; "
             "parser().parse_known_args(['train', '--attention', 'dot', '--seed', '3']); "
             "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout == "False\n"


def test_translating_and_serving_import_no_lightning(run, tmp_path):
    """translate and serve load a run and decode without Lightning, datasets or matplotlib:
    Lightning brings torchmetrics, which imports transformers where it is installed, and a
    served model's worker process imports all of it again (tens of seconds on a GPU machine)."""
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n")
    check = ("import sys; import nmt.serve; from nmt.cli import main; "
             f"main(['translate', '--checkpoint', {str(run)!r}, '--input', {str(source)!r}]); "
             "print([m for m in ('lightning', 'lightning_fabric', 'pytorch_lightning', 'torchmetrics', "
             "'transformers', 'datasets', 'matplotlib') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]"


def test_preparing_evaluating_and_keying_a_studys_cells_import_no_lightning(run):
    """prepare, evaluate and nmt compare's keying of its cells (training's config checks) start
    without Lightning: its import (torch._dynamo, torchmetrics with matplotlib) was 5 of the
    11 s that ``nmt prepare --list`` took on a 2-core Zen 3, before it listed anything."""
    config = str(run / "config.yaml")
    check = ("import sys; from nmt.cli import main; from nmt.compare import cell_key; "
             f"assert main(['prepare', '--list', '--config', {config!r}]) == 0; "
             f"assert main(['evaluate', '--checkpoint', {str(run)!r}, '--beam', '1']) == 0; "
             f"cell_key({config!r}, []); "
             "print([m for m in ('lightning', 'lightning_fabric', 'pytorch_lightning', 'torchmetrics') "
             "if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("config", ["rnn_bahdanau", "transformer"])
def test_a_shape_model_is_the_models_shapes_on_meta_without_torch_dynamo(config):
    """build_shape_model (a server's check of the weights before its workers load them, /info's
    parameter count, the precision probe, attention statistics) builds the default model's
    parameters, shapes and names on the meta device, without importing torch._dynamo: torch
    fills an embedding on the meta device through it, 2.1 of the 11 s ``nmt serve`` took to
    answer /health on a 2-core Zen 3. Outside it, normal_ fills as before."""
    check = ("import sys, torch; from nmt.config import load_config; "
             "from nmt.models import build_model, build_shape_model; "
             f"model = load_config({str(REPO / 'configs' / (config + '.yaml'))!r}).model; "
             "shape = build_shape_model(model, 100); "
             "print('torch._dynamo' in sys.modules, "
             "{t.device.type for t in [*shape.parameters(), *shape.buffers()]}); "
             "real = build_model(model, 100); "
             "same = [(n, p.shape) for n, p in shape.named_parameters()] == "
             "[(n, p.shape) for n, p in real.named_parameters()]; "
             "print(same, bool(torch.nn.init.normal_(torch.zeros(64)).abs().sum() > 0))")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["False {'meta'}", "True True"]


def test_undecodable_input_names_the_file_and_line(run, tmp_path, capsys):
    source = tmp_path / "bad.txt"
    source.write_bytes(b"haus\nhund \xff\xfe\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source)]) == 1
    assert capsys.readouterr().err == f"error: {source}, line 2: not valid UTF-8 (byte 5 of the line)\n"


@pytest.mark.parametrize("command", [["translate"], ["evaluate"], ["export", "--out", "x.ct2"]])
def test_a_folder_that_is_not_a_run_is_named_as_such(tmp_path, capsys, command):
    """--checkpoint data (a folder, but no run's): the error said "config file not found"."""
    assert main([*command, "--checkpoint", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"error: no config.yaml in {tmp_path}: is it a training "
                                       "run directory?\n")


def test_a_terminal_for_input_and_output_is_not_the_output_replacing_the_input():
    """--input /dev/stdin --output /dev/stdout in a terminal: one file (the terminal), written
    in place, not replaced; only a regular file named for both is refused."""
    from nmt.cli.decoding import check_output_is_not_input

    _, terminal = os.openpty()
    path = f"/proc/self/fd/{terminal}"
    check_output_is_not_input(path, path)  # no error
    os.close(terminal)


def test_output_under_a_file_names_that_file(run, tmp_path, capsys):
    """--output in.de/out.en, in.de a file: the error said "File exists"."""
    source = tmp_path / "in.de"
    source.write_text("haus\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--output", str(source / "sub" / "out.en")]) == 1
    assert capsys.readouterr().err == (f"error: cannot write {source / 'sub' / 'out.en'}: "
                                       f"{source} is a file, not a folder\n")


def test_output_naming_the_input_file_is_an_error_that_keeps_it(run, tmp_path, capsys, monkeypatch):
    """--output in.de with --input in.de (or the same file by another path) replaced the
    source text with its translations, silently."""
    source = tmp_path / "in.de"
    source.write_text("haus\n")
    monkeypatch.chdir(tmp_path)
    for output in (str(source), "in.de", "./sub/../in.de"):
        (tmp_path / "sub").mkdir(exist_ok=True)
        assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                     "--output", output]) == 1
        assert capsys.readouterr().err == (f"error: --output {output} is the input file: the "
                                           "translations would replace or extend the text they "
                                           "translate; write them to another file\n")
        assert source.read_text() == "haus\n"


def test_incompatible_checkpoint_and_output_not_truncated(run, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.yaml", "spm.model"):
        (broken / name).write_bytes((run / name).read_bytes())
    (broken / "best.ckpt").write_bytes(b"not a checkpoint")
    out = tmp_path / "out.txt"
    out.write_text("earlier results\n")
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--checkpoint", str(broken), "--input", str(source),
                 "--output", str(out)]) == 1
    assert "incompatible or damaged checkpoint" in capsys.readouterr().err
    assert out.read_text() == "earlier results\n"


@pytest.mark.parametrize("change,message", [
    ("nan", "its weights are not finite (NaN or infinite): the training that wrote it diverged"),
    ("rename", "Missing key(s) in state_dict: \"embed.weight\""),  # the reason, not its header
])
def test_weights_that_cannot_decode_are_named_in_one_line(run, tmp_path, capsys, change, message):
    other = tmp_path / "other"
    other.mkdir()
    for name in ("config.yaml", "spm.model"):
        (other / name).write_bytes((run / name).read_bytes())
    checkpoint = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    weights = checkpoint["state_dict"]
    if change == "nan":
        weights["model.embed.weight"][5, 0] = float("nan")
    else:
        weights["model.embedding.weight"] = weights.pop("model.embed.weight")
    torch.save(checkpoint, other / "best.ckpt")
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--checkpoint", str(other), "--input", str(source)]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    with pytest.raises(NMTError, match=re.escape(message)):  # as serve checks before its workers
        check_run_weights(other)


@pytest.mark.parametrize("change", ["pair", "attention", "heads", "pieces"])
def test_weights_of_another_run_that_decodes_otherwise_are_refused(run, corpus, tmp_path, capsys,
                                                                    change):
    """--weights may name a file outside the run, and weights of the same shapes load into
    its model whatever run wrote them: a checkpoint of a run trained in the other direction
    (the same corpus: the same pieces), with another scorer without weights of its own, or
    with another SentencePiece model translated silently wrong (into the source language,
    with the wrong scorer, its piece ids read as other pieces). A file of the run itself, of
    a copy of it, or an average of it written into the other run decodes as before."""
    from nmt.data.tokenizer import train_tokenizer

    other = tmp_path / "other"
    shutil.copytree(run, other)
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n")
    assert main(["translate", "--checkpoint", str(run), "--weights", str(other / "best.ckpt"),
                 "--input", str(source)]) == 0  # a copy of the run: the same run
    capsys.readouterr()
    config = load_config(other / "config.yaml")
    if change == "pair":
        config.data.src_lang, config.data.tgt_lang = config.data.tgt_lang, config.data.src_lang
    elif change == "attention":
        config.model["attention"] = "dot"
    elif change == "heads":  # the same weights' shapes, split otherwise
        config.model["heads"] = 1
    else:  # as many pieces, learnt from other text
        lines = Path(corpus[1]["train"][0]).read_text(encoding="utf-8").splitlines()
        train_tokenizer([line[::-1] for line in lines], other / "spm.model", config.data.vocab_size)
    save_config(config, other / "config.yaml")
    for weights in (other / "best.ckpt", sorted((other / "steps").glob("*.ckpt"))[0]):
        out = tmp_path / "out.txt"
        assert main(["translate", "--checkpoint", str(run), "--weights", str(weights),
                     "--input", str(source), "--output", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --weights {weights} is a checkpoint of the run {other}, ")
        assert err.count("\n") == 1 and not out.exists()
    # An average of this run written into the other one is not the other run's
    assert main(["average", "--checkpoint", str(run), "--out", str(other / "mine.ckpt")]) == 0
    assert main(["translate", "--checkpoint", str(run), "--weights", str(other / "mine.ckpt"),
                 "--input", str(source)]) == 0


def test_weights_of_a_run_that_names_its_default_attention_are_not_refused(run, tmp_path):
    """A run whose config leaves model.attention out trains the family's default scorer:
    its checkpoint decodes a run that names that scorer (nmt compare always names it). The
    configs' raw values were compared, and None was not scaled_dot: a false refusal."""
    other = tmp_path / "other"
    shutil.copytree(run, other)
    config = load_config(other / "config.yaml")
    assert config.model.pop("attention") == "scaled_dot"  # the Transformer's default
    save_config(config, other / "config.yaml")
    for weights in (other / "best.ckpt", run / "best.ckpt"):  # either way round
        checkpoint = other if weights.parent == run else run
        assert check_run_weights(checkpoint, weights) == weights


def test_a_run_that_diverges_stops_in_one_line_before_writing_its_weights(corpus, tmp_path, capsys):
    """A learning rate of 1e30 makes the weights NaN by the first validation: training stops
    there (it went on to the end, exit 0, with NaN checkpoints that decoded nothing), and a
    fixed command starts the run anew in the same folder."""
    folder, files = corpus
    args = tiny_train_args(files, tmp_path / "run", folder / "data", epochs=2)
    assert main([*args, "optim.lr=1e30", "optim.warmup_steps=1", "trainer.gradient_clip_val=0"]) == 1
    err = capsys.readouterr().err
    assert "error: training diverged: validation loss nan at update" in err
    assert not list((tmp_path / "run").rglob("*.ckpt"))
    assert main(args) == 0 and (tmp_path / "run" / "last.ckpt").is_file()


def _weights(path, key="state_dict"):
    return torch.load(path, map_location="cpu", weights_only=False)[key]


def _segment_starts(run_dir) -> list[int]:
    """The update each training segment of a run started from (train_stats.json)."""
    return [s["from_step"] for s in json.loads((run_dir / "train_stats.json").read_text())["segments"]]


def test_resume_continues_like_an_uninterrupted_run(corpus, run):
    folder, files = corpus
    resumed = folder / "resumed"
    assert main(tiny_train_args(files, resumed, folder / "data", epochs=1)) == 0  # "killed" here
    first = torch.load(resumed / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert main(tiny_train_args(files, resumed, folder / "data", epochs=2)) == 0  # same command
    assert _segment_starts(resumed) == [0, first] and first > 0  # resumed, not trained anew
    # The same command once more: nothing is left to train, and no segment is noted (one was,
    # naming a device and code that trained none of the weights)
    assert main(tiny_train_args(files, resumed, folder / "data", epochs=2)) == 0
    assert _segment_starts(resumed) == [0, first]
    straight, again = _weights(run / "last.ckpt"), _weights(resumed / "last.ckpt")
    assert straight.keys() == again.keys()
    for key in straight:
        torch.testing.assert_close(again[key], straight[key], msg=key)


def test_weight_ema_is_saved_and_resumes_exactly(corpus, run, tmp_path):
    """With optim.ema_decay the checkpoints hold the average (what translate loads) and the
    raw weights; a run resumed after its first epoch ends with both equal to a straight run's."""
    folder, files = corpus
    ema = ["optim.ema_decay=0.99"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert main(tiny_train_args(files, straight, folder / "data", epochs=2) + ema) == 0
    assert main(tiny_train_args(files, resumed, folder / "data", epochs=1) + ema) == 0
    assert main(tiny_train_args(files, resumed, folder / "data", epochs=2) + ema) == 0
    assert _segment_starts(resumed)[0] == 0 and _segment_starts(resumed)[1] > 0  # resumed
    for key in ("state_dict", "current_model_state"):
        want, got = _weights(straight / "last.ckpt", key), _weights(resumed / "last.ckpt", key)
        for name in want:
            torch.testing.assert_close(got[name], want[name], msg=f"{key} {name}")
    average, raw = (_weights(straight / "last.ckpt", k) for k in ("state_dict", "current_model_state"))
    assert any(not torch.equal(average[k], raw[k]) for k in raw)
    # The raw weights are those of the run without averaging: EMA only observes training.
    for name, value in _weights(run / "last.ckpt").items():
        torch.testing.assert_close(raw[name], value, msg=name)


def test_ddp_on_two_cpu_processes(tmp_path):
    """Two processes train and validate; each decodes its share of an odd number of
    validation sentences, and the BLEU they report together equals one process's on the
    same checkpoint (one sentence per decoding batch, so padding cannot change a number)."""
    files = write_corpus(tmp_path, sizes=(("train", 300), ("val", 41), ("test", 30)))
    run_dir = tmp_path / "ddp"
    args = tiny_train_args(files, run_dir, tmp_path / "data", epochs=1)
    args += ["--trainer.strategy", "ddp", "--trainer.devices", "2", "trainer.precision=32-true",
             "data.eval_max_tokens=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "nmt", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run_dir / "best.ckpt").is_file()
    assert "distributed_backend=gloo" in done.stderr  # two processes really joined
    # Said once, not by each process; no false alarm, and no worker aborting at its exit.
    assert done.stdout.count("run directory: ") == done.stdout.count("precision: ") == 1
    assert "sync_dist" not in done.stderr and "terminate called" not in done.stderr
    [(_, ddp_bleu)] = _validations(run_dir)
    single = subprocess.run([sys.executable, "-m", "nmt", "evaluate", "--checkpoint", str(run_dir),
                             "--split", "val", "--beam", "1"], capture_output=True, text=True,
                            env=env, timeout=300, cwd=REPO)
    assert single.returncode == 0, single.stderr[-2000:]
    scores = json.loads((run_dir / "eval" / "val.beam1.json").read_text())
    assert scores["sentences"] == 41 and scores["bleu"] > 0
    assert scores["bleu"] == round(ddp_bleu, 2)  # evaluate reports two decimals
    # train_stats.json counts the target tokens that both processes trained on.
    stats = json.loads((run_dir / "train_stats.json").read_text())
    assert stats["world_size"] == 2
    assert stats["tgt_tokens"] == _epoch_target_tokens(run_dir, world_size=2)


def _epoch_target_tokens(run_dir: Path, world_size: int) -> int:
    """The non-pad target tokens (pieces + EOS) of one training epoch's batches, over all
    ``world_size`` processes, as the run's own sampler cuts them."""
    config = load_config(run_dir / "config.yaml")
    train_set = split_dataset(prepare_data(config.data), "train", config.data.max_len)
    tokens = 0
    for rank in range(world_size):
        sampler = TokenBatchSampler(train_set.lengths(), config.data.max_tokens, shuffle=True,
                                    seed=config.seed, rank=rank, world_size=world_size)
        sampler.set_epoch(0)
        tokens += sum(int(train_set.tgt.lengths[rows].sum()) + len(rows) for rows in sampler)
    return tokens


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_auto_precision_is_probed_at_the_beam_given(run, tmp_path, monkeypatch, capsys, command):
    """--beam 1 decodes greedily, but auto's probe timed beam search at the run's
    decoding.beam_size (5): the precision of another search."""
    from nmt import precision

    copy = tmp_path / "run"  # evaluate writes into the run's eval/
    shutil.copytree(run, copy)
    monkeypatch.setattr(precision, "CACHE", tmp_path / "precision.json")
    monkeypatch.setattr(precision, "has_native_bf16", lambda: True)
    beams = []
    monkeypatch.setattr(precision, "time_decoding", lambda model, sentences, beam, **_: beams.append(
        beam) or {"fp32": 1.0, "bf16": 0.5, "steady": True})
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    extra = ["--input", str(source)] if command == "translate" else []
    assert load_config(copy / "config.yaml").decoding.beam_size == 5
    assert main([command, "--checkpoint", str(copy), "--precision", "auto", "--beam", "1",
                 *extra]) == 0
    assert beams == [1] and "x beam 1 " in capsys.readouterr().err


def test_a_beam_too_large_is_refused_before_autos_probe_decodes_at_it(run, tmp_path, monkeypatch,
                                                                     capsys):
    """The probe decodes at the beam given: one over the vocabulary's size is refused first."""
    from nmt import precision

    monkeypatch.setattr(precision, "CACHE", tmp_path / "precision.json")
    monkeypatch.setattr(precision, "has_native_bf16", lambda: True)
    monkeypatch.setattr(precision, "time_decoding", None)  # a probe would fail with a traceback
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    for beam, message in (("100000", "error: beam 100,000 is more than the vocabulary's"),
                          ("0", "error: need beam >= 1, got beam 0")):
        assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                     "--precision", "auto", "--beam", beam]) == 1
        err = capsys.readouterr().err
        assert err.startswith(message) and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("extra,message", [
    (["--nbest", "0"], "nbest"),
    (["--beam", "-2"], "beam >= 1"),
    (["--beam", "100000"], "is more than the vocabulary's"),  # bad_alloc, or the OOM killer
    (["--device", "cuda"], "CUDA") if not torch.cuda.is_available() else (["--nbest", "9"], "nbest"),
])
def test_bad_decoding_options(run, tmp_path, extra, message, capsys):
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def config_only_run(tmp_path: Path, overrides: list[str] = ()) -> Path:
    """A run folder that holds its config.yaml alone: a command that loads its model fails on
    the missing files, so one that fails otherwise failed before loading it."""
    folder = tmp_path / "run"
    folder.mkdir()
    save_config(load_config(overrides=list(overrides)), folder / "config.yaml")
    return folder


@pytest.mark.parametrize("where,message", [
    (["--input", "{tmp}/typo.de"], "cannot read {tmp}/typo.de: No such file or directory"),
    (["--output", "{tmp}"], "output {tmp} is a directory"),
    (["--output", "{tmp}/in.de/out.en"],
     "cannot write {tmp}/in.de/out.en: {tmp}/in.de is a file, not a folder"),
])
def test_translate_says_what_it_cannot_read_or_write_before_loading_the_model(tmp_path, where,
                                                                              message, capsys):
    """A mistyped --input, or an --output that cannot be written, was an error only once the
    model had loaded and --precision auto had timed it (10 s for a small Transformer, 17 s
    for an ensemble of two): the files are opened first now."""
    folder = config_only_run(tmp_path)
    (tmp_path / "in.de").write_text("haus\n")
    where = [arg.format(tmp=tmp_path) for arg in where]
    args = ["--input", str(tmp_path / "in.de")] if "--output" in where else []
    assert main(["translate", "--checkpoint", str(folder), *args, *where]) == 1
    assert capsys.readouterr().err == f"error: {message.format(tmp=tmp_path)}\n"


@pytest.mark.parametrize("command,extra,message", [
    ("translate", ["--beam", "2", "--nbest", "3"], "need beam >= 1 and 1 <= nbest <= beam, got beam 2"),
    ("translate", ["--beam", "1", "decoding.nbest=2"], "the run's decoding.nbest 2 is more than the beam 1"),
    ("translate", ["--alpha", "-1"], "the length penalty alpha must be from 0 (none) to 10"),
    # overflowed on a long output: a traceback
    ("translate", ["--alpha", "300"], "the length penalty alpha must be from 0 (none) to 10, got 300.0"),
    ("translate", ["--prune-margin", "x"], "--prune-margin must be a number >= 0 or none"),
    ("evaluate", ["--alpha", "nan"], "the length penalty alpha must be a number, got nan"),
    ("evaluate", ["--prune-margin", "-1"], "--prune-margin must be a number >= 0 or none"),
    ("evaluate", ["--engine", "ctranslate2", "--prune-margin", "2"],
     "--prune-margin is for the torch engine"),
])
def test_bad_decoding_options_fail_before_the_model_loads(tmp_path, command, extra, message,
                                                          capsys):
    """A bad --beam / --nbest pair, --alpha or --prune-margin was refused only once the model
    had loaded and --precision auto had timed it (7-14 s on a small Transformer): they are
    checked against the run's config first. The folder here holds a config and nothing to
    load, so a check made after the load would fail on the missing files instead. (A dotted
    key in ``extra`` goes into that config.)"""
    folder = config_only_run(tmp_path, [o for o in extra if "=" in o])
    if "ctranslate2" in extra:
        (folder / "model.bin").write_bytes(b"")  # an export's, damaged: never read
    source = tmp_path / "in.de"
    source.write_text("haus\n")
    what = ["--input", str(source)] if command == "translate" else ["--files", str(source), str(source)]
    options = [o for o in extra if "=" not in o]
    assert main([command, "--checkpoint", str(folder), *what, *options]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize("beam", ["1", "2"])
def test_a_negative_output_length_ratio_in_a_run_is_a_one_line_error(run, tmp_path, capsys, beam):
    """decoding.max_len_ratio -1 in a run's config.yaml (edited by hand) left outputs no
    steps: a traceback in greedy and in beam search."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = load_config(copy / "config.yaml")
    config.decoding.max_len_ratio = -1.0
    save_config(config, copy / "config.yaml")
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--checkpoint", str(copy), "--input", str(source), "--beam", beam]) == 1
    err = capsys.readouterr().err
    assert err == "error: decoding.max_len_ratio must be 0 or more, got -1.0\n", err


def test_translate_takes_the_runs_nbest_unless_given(run, tmp_path, capsys):
    """decoding.nbest in the run's config is translate's default: Moses n-best rows."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = load_config(copy / "config.yaml")
    config.decoding.nbest = 2
    save_config(config, copy / "config.yaml")
    source = tmp_path / "in.txt"
    source.write_text("haus\nhund katze\n")
    for extra, fields in (([], [["0", "0", "1", "1"], 4]), (["--nbest", "1"], [2, 1])):
        capsys.readouterr()
        assert main(["translate", "--checkpoint", str(copy), "--input", str(source), "--beam", "3",
                     *extra]) == 0
        rows = [row.split(" ||| ") for row in capsys.readouterr().out.splitlines()]
        ids, width = fields
        assert ([row[0] for row in rows] if width == 4 else len(rows)) == ids
        assert {len(row) for row in rows} == {width}
    assert main(["translate", "--checkpoint", str(copy), "--input", str(source), "--beam", "1"]) == 1
    assert capsys.readouterr().err == ("error: the run's decoding.nbest 2 is more than the beam 1: "
                                       "give --nbest (1 for one translation a line)\n")


def test_output_to_a_directory_is_an_error(run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("haus\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source),
                 "--output", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
    assert not list(tmp_path.glob(".*tmp*"))


def test_output_to_a_pipe_or_a_link_is_written_through(run, tmp_path, capsys):
    """--output to a named pipe writes into it (a reader gets the lines; it stays a pipe), and to
    a symbolic link replaces the file it points at, keeping the link."""
    source = tmp_path / "in.txt"
    source.write_text("haus mann\nhund\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "1"]) == 0
    expected = capsys.readouterr().out
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that the writer may open
    try:
        assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "1",
                     "--output", str(fifo)]) == 0
        assert os.read(reader, 1 << 16).decode() == expected  # small: it waits in the pipe
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "1",
                 "--output", str(link)]) == 0
    assert link.is_symlink() and target.read_text() == expected
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--output", str(loop)]) == 1
    assert "a loop of symbolic links" in capsys.readouterr().err


def test_output_to_dev_stdout_writes_to_the_stream_whatever_it_is(run, tmp_path):
    """--output /dev/stdout (a link to the process' own stdout) is written in place: into a pipe,
    or into the file stdout was sent to, never replaced by a file of its own."""
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n")
    command = [sys.executable, "-m", "nmt", "translate", "--checkpoint", str(run), "--input",
               str(source), "--beam", "1", "--output", "/dev/stdout"]
    piped = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert piped.returncode == 0 and piped.stdout.count("\n") == 1, piped.stderr
    log = tmp_path / "log.txt"
    with open(log, "w") as out:
        inode = os.fstat(out.fileno()).st_ino
        assert subprocess.run(command, stdout=out, cwd=REPO, timeout=300).returncode == 0
    assert log.read_text() == piped.stdout and log.stat().st_ino == inode  # the same file


def test_output_to_dev_stdout_keeps_what_the_shell_writes_around_it(run, tmp_path):
    """--output /dev/stdout goes through stdout itself: opened anew, it truncated a file the
    shell appends to (>>) and was written from the file's start, over what the shell wrote
    before and after it."""
    source = tmp_path / "in.txt"
    source.write_text("haus mann\nkatze\n")
    command = shlex.join([sys.executable, "-m", "nmt", "translate", "--checkpoint", str(run),
                          "--input", str(source), "--beam", "1", "--output", "/dev/stdout"])
    for fd in (1, 2):  # /dev/stdout, /dev/stderr
        log = tmp_path / f"log{fd}.txt"
        log.write_text("keep\n")
        shell = (f"{{ echo header >&{fd}; {command.replace('/dev/stdout', f'/dev/fd/{fd}')}; "
                 f"echo footer >&{fd}; }} {fd}>> {shlex.quote(str(log))}")
        assert subprocess.run(["bash", "-c", shell], cwd=REPO, timeout=300).returncode == 0
        lines = log.read_text().splitlines()
        assert lines[:2] == ["keep", "header"] and lines[-1] == "footer" and len(lines) == 5, lines


@pytest.mark.parametrize("options, redirect, message", [
    ("--output {source}", "< {source}", "--output {source} is the input file (stdin)"),
    ("--buffer-lines 1", "< {source} >> {source}", "stdout is the input file (stdin)"),  # no end
    ("", "<&-", "stdin is closed: give --input FILE"),
    ("", ">&-", "stdout is closed: give --output FILE"),
    # the input file would have taken the closed fd 1, and /dev/stdout truncated it
    ("--input {source} --output /dev/stdout", ">&-", "stdout is closed: give --output FILE"),
])
def test_stdin_and_stdout_as_the_shell_left_them(run, tmp_path, options, redirect, message):
    source = tmp_path / "in.txt"
    source.write_text("haus mann\n")
    fill = {"source": shlex.quote(str(source))}
    command = shlex.join([sys.executable, "-m", "nmt", "translate", "--checkpoint", str(run)])
    # exec: a timeout kills the command itself, not only the shell (< f >> f looped for good)
    shell = f"exec {command} {options.format(**fill)} {redirect.format(**fill)}"
    done = subprocess.run(["bash", "-c", shell], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.startswith(f"error: {message.format(source=source)}")
    assert done.stderr.count("\n") == 1, done.stderr
    assert source.read_text() == "haus mann\n"


def test_killed_run_resumes_to_the_same_weights(corpus, run):
    """Kill a 2-epoch run with SIGKILL once its first checkpoint exists; the same command
    then finishes it with exactly the weights of the uninterrupted run."""
    folder, files = corpus
    run_dir = folder / "killed"
    # Each step slowed (its numbers unchanged): the tiny run's 4 updates of its second epoch
    # took less than the 50 ms between two looks for the first checkpoint, and the kill came
    # after the last one, leaving nothing to resume
    slowed = ("import sys, time\nfrom nmt.training import TranslationModule\n"
              "step = TranslationModule.training_step\n"
              "TranslationModule.training_step = lambda *a: (time.sleep(0.2), step(*a))[1]\n"
              "from nmt.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    command = [sys.executable, "-c", slowed, *tiny_train_args(files, run_dir, folder / "data", 2)]
    # Same thread count as this process, so float reductions run in the same order.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run_dir / "last.ckpt").exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL  # killed, not finished
    cut = torch.load(run_dir / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert main(tiny_train_args(files, run_dir, folder / "data", 2)) == 0
    assert _segment_starts(run_dir) == [0, cut] and 0 < cut < _weights(run / "last.ckpt", "global_step")
    straight, resumed = _weights(run / "last.ckpt"), _weights(run_dir / "last.ckpt")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], msg=key)


def _validations(run_dir, metric: str = "val_bleu") -> list[tuple[int, float]]:
    """(logged step, metric) of every validation in a run's metrics.csv."""
    with open(run_dir / "logs" / "version_0" / "metrics.csv") as f:
        return [(int(r["step"]), float(r[metric])) for r in csv.DictReader(f) if r[metric]]


@pytest.mark.parametrize("metric,pick", [("val_loss", min), ("val_bleu", max)])
def test_budget_ending_inside_an_epoch_validates_the_tail(corpus, run, tmp_path, metric, pick):
    """A step budget that ends inside an epoch still validates the last stretch, and
    best.ckpt holds whichever validated weights scored better in trainer.best_metric."""
    folder, files = corpus
    steps_per_epoch = _validations(run)[0][0] + 1
    run_dir = tmp_path / "tail"
    args = tiny_train_args(files, run_dir, folder / "data", epochs=5)
    assert main(args + [f"trainer.max_steps={steps_per_epoch + 2}",
                        f"trainer.best_metric={metric}"]) == 0
    (epoch_step, epoch_score), (tail_step, tail_score) = _validations(run_dir, metric)
    # Lightning logs a validation at the step before it (the tail, too, is validated in the loop).
    assert (epoch_step, tail_step) == (steps_per_epoch - 1, steps_per_epoch + 1)
    tail_is_best = pick(epoch_score, tail_score) == tail_score and epoch_score != tail_score
    best = torch.load(run_dir / "best.ckpt", map_location="cpu", weights_only=False)
    assert best["global_step"] == (steps_per_epoch + 2 if tail_is_best else steps_per_epoch)
    stats = json.loads((run_dir / "train_stats.json").read_text())
    assert stats["steps"] == steps_per_epoch + 2
    assert stats[f"best_{metric}"] == pytest.approx(pick(epoch_score, tail_score), abs=1e-4)


def test_unknown_best_metric_is_one_line_error(corpus, tmp_path, capsys):
    folder, files = corpus
    args = tiny_train_args(files, tmp_path / "r", folder / "data")
    assert main(args + ["trainer.best_metric=val_acc"]) != 0
    err = capsys.readouterr().err.strip()
    assert "unknown trainer.best_metric 'val_acc'" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("missing", ["files", "folder"])
def test_a_missing_corpus_is_the_only_line_training_prints(corpus, tmp_path, capfd, monkeypatch,
                                                          missing):
    """Before the one-line error came the precision chosen and Lightning's GPU/TPU lines."""
    monkeypatch.setattr(nmt.trainer, "_announced", set())  # as in a new process
    folder, files = corpus
    args = tiny_train_args(files, tmp_path / "r", folder / "data") + ["trainer.precision=auto"]
    if missing == "files":
        args += [f"data.train_files=[{tmp_path / 'gone.de'},{tmp_path / 'gone.en'}]"]
        message = f"error: data.train_files: no such file: {tmp_path / 'gone.de'}"
    else:
        args = [a for a in args if not a.startswith(("data.train_files", "data.val_files",
                                                     "data.test_files"))]
        args += ["data.corpus=elsewhere"]
        message = f"error: corpus 'elsewhere' not found: no {folder / 'data' / 'elsewhere'}/train.de"
    assert main(args) == 1
    out, err = capfd.readouterr()
    assert out == "" and err.startswith(message) and len(err.splitlines()) == 1, (out, err)
    assert not (tmp_path / "r").exists()


def test_rerunning_a_finished_run_changes_nothing(corpus, run, tmp_path):
    """The same command on a finished run exits 0 without training or validating again."""
    folder, files = corpus
    copy = tmp_path / "again"
    shutil.copytree(run, copy)
    assert main(tiny_train_args(files, copy, folder / "data", epochs=2)) == 0
    validations = [row for log in (copy / "logs").glob("version_*/metrics.csv")
                   for row in csv.DictReader(open(log)) if row["val_bleu"]]
    assert len(validations) == len(_validations(run))
    for name, value in _weights(run / "last.ckpt").items():
        torch.testing.assert_close(_weights(copy / "last.ckpt")[name], value, msg=name)


@pytest.mark.parametrize("content, message", [
    (b"- a list\n- of items\n", "must hold sections of options (a mapping), not a list"),
    (b"model: {dropout: 0.1}\n# \xff\n", "is not valid YAML"),
])
def test_a_config_file_that_is_not_a_mapping_of_utf8_yaml_is_one_line(tmp_path, capsys, content,
                                                                       message):
    (tmp_path / "bad.yaml").write_bytes(content)
    assert main(["train", "--config", str(tmp_path / "bad.yaml")]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_stop_while_a_config_is_read_is_taken_once_it_is_read(monkeypatch):
    """SIGTERM raised inside OmegaConf (as nmt's handler raises it) left a node half-built:
    nmt bench data, stopped while it read its config, printed a ConfigKeyError traceback
    ("'NoneType' object has no attribute '_invalidate_flags_cache'") and exited 1, not 143."""
    import signal

    from omegaconf import OmegaConf

    from nmt.config import _resolved, load_config
    from nmt.errors import Stopped, raise_stopped

    create, read = OmegaConf.create, []

    def stopped_inside(*args, **kwargs):  # the stop, in the middle of OmegaConf's work
        signal.raise_signal(signal.SIGTERM)
        return create(*args, **kwargs)

    monkeypatch.setattr(OmegaConf, "create", stopped_inside)
    monkeypatch.setattr("nmt.config.expand_home", read.append)  # the config's last step
    _resolved.cache_clear()  # resolved anew, not remembered from another test's load
    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        with pytest.raises(Stopped):
            load_config(REPO / "configs" / "transformer.yaml")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(read) == 1  # read whole, then stopped


def test_a_config_loaded_again_is_the_files_own_and_the_callers_to_change(tmp_path, monkeypatch):
    """load_config remembers what it resolved (nmt compare resolves each cell's config several
    times), yet each call gets its own copy to change, a file changed since is read anew, ~ is
    expanded for the home of the call, and an environment variable read by an interpolation
    is read again."""
    from nmt.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("data: {vocab_size: 300, data_dir: ~/d}\n", encoding="utf-8")
    first = load_config(path, ["model.attention=dot"])
    first.data.vocab_size, first.model["attention"] = 1, "changed"
    again = load_config(path, ["model.attention=dot"])
    assert (again.data.vocab_size, again.model["attention"]) == (300, "dot")
    path.write_text("data: {vocab_size: 400, data_dir: ~/d}\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    changed = load_config(path, ["model.attention=dot"])
    assert (changed.data.vocab_size, changed.data.data_dir) == (400, str(tmp_path / "home" / "d"))
    for value in ("first", "second"):
        monkeypatch.setenv("NMT_TEST_DATA", value)
        assert load_config(path, ["data.data_dir=${oc.env:NMT_TEST_DATA}"]).data.data_dir == value


@pytest.mark.parametrize("option, message", [
    ("data.train_files=tr.de", "data.train_files takes a list: data.train_files=[a,b] on the "
                               "command line, [a, b] in YAML"),  # was OmegaConf's AnyNode jargon
    ("data.max_tokens=abc", "data.max_tokens: Value 'abc' of type 'str' could not be converted"),
    ("data.bogus=1", "data.bogus: Key 'bogus' not in 'DataConfig'"),
])
def test_a_bad_option_names_its_key(capsys, option, message):
    assert main(["prepare", "--config", str(REPO / "configs/transformer.yaml"), option]) == 1
    assert capsys.readouterr().err.startswith(f"error: bad config: {message}")


@pytest.mark.parametrize("command, option, message", [
    (["train"], ["--max-tim", "00:01:00"], "unknown option --max-tim: did you mean --max-time?"),
    (["train"], ["--train-line", "100"], "did you mean --train-lines?"),  # not "trainer"
    (["train"], ["--run-dri", "x"], "did you mean --run-dir?"),  # the flag, not run_dir
    (["bench", "train"], ["--src_lang", "de"], "did you mean --src-lang?"),
    (["train"], ["--beam", "5"], "unknown option --beam: config keys are set as --section.key"),
    (["train"], ["--lr", "0.1"], "unknown option --lr: did you mean --optim.lr?"),  # not --help
    (["train"], ["lr=0.1"], "unknown option lr: did you mean optim.lr?"),  # as written
    (["train"], ["--lr=0.1"], "unknown option --lr: did you mean --optim.lr?"),
    (["train"], ["--help-me", "1"], "config keys are set as --section.key"),
    # a whole section is a config key: taken as one, as before (so a bad value, status 1)
    (["train"], ["--trainer", "{max_epochs: 0}"], "trainer.max_epochs and trainer.max_steps of 0"),
])
def test_a_misspelt_option_is_named_with_the_nearest_one(tmp_path, capsys, command, option, message):
    """Left over by the parser, an undotted option read as a config key: "Key 'max_tim' not in
    'Config'", or a wrong guess ("Did you mean: 'trainer'?")."""
    status = 1 if option[0] == "--trainer" else 2  # a usage error, as argparse's
    assert main([*command, "--config", str(REPO / "configs/transformer.yaml"), *option,
                 "--run-dir", str(tmp_path / "run")]) == status
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_damaged_gzip_corpus_is_one_line(tmp_path, capsys):
    files = write_corpus(tmp_path)
    source = tmp_path / "train.de.gz"
    with gzip.open(source, "wb") as f:
        f.write(open(files["train"][0], "rb").read())
    source.write_bytes(source.read_bytes()[:-20])  # truncated: no end of stream
    assert main(["prepare", "--config", "configs/transformer.yaml",
                 f"data.train_files=[{source},{files['train'][1]}]",
                 f"data.val_files=[{','.join(files['val'])}]", f"data.data_dir={tmp_path / 'data'}",
                 "data.vocab_size=100"]) == 1
    err = capsys.readouterr().err
    assert "train.de.gz: damaged gzip file" in err and "Traceback" not in err
    assert err.count("error:") == 1  # after the "preparing ..." line


def test_corpus_files_named_from_one_folder_are_the_runs_from_any_other(corpus, tmp_path,
                                                                        monkeypatch, capsys):
    """Relative corpus paths went into config.yaml as typed: evaluate run from another folder
    then read that folder's files of the same names (or failed). They are saved absolute."""
    folder, files = corpus
    monkeypatch.chdir(folder)
    relative = {split: [Path(path).name for path in pair] for split, pair in files.items()}
    run_dir = tmp_path / "run"
    assert main(tiny_train_args(relative, run_dir, tmp_path / "data", epochs=1)) == 0
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]
    assert saved["test_files"] == [str(folder / name) for name in relative["test"]]
    elsewhere = tmp_path / "elsewhere"  # the same names, other sentences
    elsewhere.mkdir()
    for name in relative["test"]:
        (elsewhere / name).write_text("".join(f"x{i}\n" for i in range(30)))
    monkeypatch.chdir(elsewhere)
    assert main(["evaluate", "--checkpoint", str(run_dir), "--beam", "1"]) == 0
    hyps = (run_dir / "eval" / "test.beam1.hyp").read_text(encoding="utf-8").splitlines()
    refs = Path(files["test"][1]).read_text(encoding="utf-8").splitlines()
    assert json.loads((run_dir / "eval" / "test.beam1.json").read_text())["bleu"] == \
        pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=0.006)


def test_evaluate_reads_the_runs_own_local_corpus_from_any_folder(tmp_path, monkeypatch):
    """A run on a local corpus (data/<corpus>/, named relative to the project) evaluated from
    another folder that has a data/<corpus>/ of its own: it scored against that folder's test
    set, under the run's file names; now against the run's."""
    for folder, sizes in (("project", (("train", 300), ("val", 40), ("test", 30))),
                          ("elsewhere", (("train", 20), ("val", 5), ("test", 7)))):
        corpus = tmp_path / folder / "data" / "tiny"
        corpus.mkdir(parents=True)
        for split, (src, tgt) in write_corpus(corpus, sizes).items():
            stem = "test_2016_flickr" if split == "test" else split
            os.rename(src, corpus / f"{stem}.de")
            os.rename(tgt, corpus / f"{stem}.en")
    monkeypatch.chdir(tmp_path / "project")
    args = [a for a in tiny_train_args({s: ["x", "y"] for s in ("train", "val", "test")},
                                       Path("run"), Path("data"))
            if not a.startswith(("data.train_files", "data.val_files", "data.test_files"))]
    assert main([*args, "data.corpus=tiny"]) == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    run = tmp_path / "project" / "run"
    assert main(["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "1"]) == 0
    assert json.loads((run / "eval" / "test.beam1.json").read_text())["sentences"] == 30


def test_a_run_on_a_local_hub_folder_evaluates_and_resumes_from_any_folder(tmp_path, monkeypatch):
    """data.hub_dataset=./hub (a folder in the Hub's layout) stayed relative in config.yaml:
    evaluate from another folder looked for './hub' on the Hub. A run saved so still resumes."""
    hub = tmp_path / "project" / "hub"
    hub.mkdir(parents=True)
    for split, (src, tgt) in write_corpus(tmp_path).items():
        pairs = zip(*(Path(path).read_text(encoding="utf-8").splitlines() for path in (src, tgt)))
        rows = [json.dumps({"translation": {"de": s, "en": t}}) for s, t in pairs]
        (hub / f"{'validation' if split == 'val' else split}.jsonl").write_text("\n".join(rows) + "\n")
    monkeypatch.chdir(tmp_path / "project")
    def args(epochs: int) -> list[str]:
        named = ("data.train_files", "data.val_files", "data.test_files")
        return [a for a in tiny_train_args({s: ["x", "y"] for s in ("train", "val", "test")},
                                           Path("run"), Path("data"), epochs)
                if not a.startswith(named)] + ["data.hub_dataset=./hub"]

    assert main(args(1)) == 0
    run = tmp_path / "project" / "run"
    saved = run / "config.yaml"
    assert load_config(saved).data.hub_dataset == str(hub)
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--checkpoint", str(run), "--split", "test", "--beam", "1"]) == 0
    assert json.loads((run / "eval" / "test.beam1.json").read_text())["sentences"] == 30
    monkeypatch.chdir(tmp_path / "project")  # saved relative, as before: resumes
    saved.write_text(saved.read_text().replace(f"hub_dataset: {hub}", "hub_dataset: ./hub"))
    assert main(args(2)) == 0
    assert json.loads((run / "train_stats.json").read_text())["epochs"] == 2


def test_evaluating_a_split_needs_only_its_own_files(run, tmp_path, capsys):
    """A run whose training corpus is gone still evaluates on its test files (it failed with
    "data.train_files: no such file"); the split whose files are gone is the one-line error."""
    moved = tmp_path / "run"
    shutil.copytree(run, moved, ignore=shutil.ignore_patterns("eval", "steps", "logs"))
    config = yaml.safe_load((moved / "config.yaml").read_text())
    config["data"]["train_files"] = [str(tmp_path / "gone.de"), str(tmp_path / "gone.en")]
    (moved / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["evaluate", "--checkpoint", str(moved), "--split", "test", "--beam", "1"]) == 0
    assert json.loads((moved / "eval" / "test.beam1.json").read_text())["sentences"] == 30
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(moved), "--split", "train", "--beam", "1"]) == 1
    assert capsys.readouterr().err == f"error: data.train_files: no such file: {tmp_path / 'gone.de'}\n"


def test_translations_go_to_stdout_in_utf8_whatever_its_encoding(run, tmp_path, monkeypatch):
    """The input is read as UTF-8 and --output files are written in it; stdout in another
    encoding (a latin-1 locale) was a UnicodeEncodeError traceback at the first output with a
    character it lacks: SentencePiece's ⁇ for an unknown piece, or Czech ř (and so was every
    command printing a path with one)."""
    from nmt.data.tokenizer import Tokenizer

    decode = Tokenizer.decode
    monkeypatch.setattr(Tokenizer, "decode", lambda self, ids: ["ř ⁇ " + t for t in decode(self, ids)])
    (tmp_path / "in.de").write_text("ein Hund\n", encoding="utf-8")
    out = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["translate", "--checkpoint", str(run), "--input", str(tmp_path / "in.de"),
                 "--beam", "1"]) == 0
    out.flush()
    written = out.buffer.getvalue().decode("utf-8")
    assert written.startswith("ř ⁇ ") and written.count("\n") == 1
    text = io.StringIO()  # a stdout of text alone (Jupyter's, redirect_stdout's) takes it as text
    monkeypatch.setattr(sys, "stdout", text)
    assert main(["translate", "--checkpoint", str(run), "--input", str(tmp_path / "in.de"),
                 "--beam", "1"]) == 0
    assert text.getvalue() == written


def test_translate_reads_gzip_and_takes_a_dash_for_stdout(run, tmp_path, capsys, monkeypatch):
    """--input x.gz was read as bytes of gzip (train and evaluate --files decompress it);
    --output - wrote a file named "-"."""
    monkeypatch.chdir(tmp_path)
    plain = tmp_path / "in.de"
    plain.write_text("haus\nein kleines haus\n")
    packed = tmp_path / "in.de.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert main(["translate", "--checkpoint", str(run), "--input", str(plain), "--beam", "1"]) == 0
    expected = capsys.readouterr().out
    assert expected.count("\n") == 2
    assert main(["translate", "--checkpoint", str(run), "--input", str(packed), "--beam", "1",
                 "--output", "-"]) == 0
    assert capsys.readouterr().out == expected and not (tmp_path / "-").exists()
    packed.write_bytes(packed.read_bytes()[:-12])  # truncated
    assert main(["translate", "--checkpoint", str(run), "--input", str(packed)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {packed}: damaged gzip file")


def test_translate_writes_an_output_named_gz_gzipped(run, tmp_path, capsys):
    """--output out.en.gz was plain text under a gzip name: zcat, and translate's own --input,
    refused it as a damaged gzip file."""
    source = tmp_path / "in.de"
    source.write_text("haus\nein kleines haus\n")
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "1"]) == 0
    expected = capsys.readouterr().out
    out = tmp_path / "out.en.gz"
    assert main(["translate", "--checkpoint", str(run), "--input", str(source), "--beam", "1",
                 "--output", str(out)]) == 0
    assert gzip.decompress(out.read_bytes()).decode() == expected
    assert out.read_bytes()[10:17] == b"out.en\0"  # the header's name, not the temporary file's
    assert out.read_bytes()[4:8] == b"\0\0\0\0"  # and no time: the same output, the same bytes
    assert main(["translate", "--checkpoint", str(run), "--input", str(out), "--beam", "1"]) == 0


@pytest.mark.parametrize("stop,nohup", [(signal.SIGTERM, False), (signal.SIGHUP, False),
                                        (signal.SIGHUP, True)])
def test_translate_stopped_part_of_the_way_leaves_no_temporary_file(run, tmp_path, stop, nohup):
    """SIGHUP (a closed terminal) left the hidden temporary output behind, exit 129. Under
    nohup (SIGHUP ignored) it translates on; SIGTERM then stops it. Each exits 128 + the
    signal's number, as its default would (it exited 130, Ctrl-C's)."""
    source = tmp_path / "in.de"
    source.write_text("ein kleines haus\n" * 5000)
    out = tmp_path / "out.en"
    process = subprocess.Popen(
        [sys.executable, "-m", "nmt", "translate", "--checkpoint", str(run), "--input",
         str(source), "--output", str(out), "--buffer-lines", "1", "--beam", "1"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # as nohup leaves it, or as a terminal's session does (whatever ran the tests: nohup too)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL))
    deadline = time.time() + 120
    while not [p for p in tmp_path.iterdir() if p.name.startswith(".out.en")] \
            and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a few chunks written
    process.send_signal(stop)
    if nohup:
        time.sleep(1.0)
        assert process.poll() is None  # still translating
        process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    last = signal.SIGTERM if nohup else stop  # exits as the signal's default would
    assert process.returncode == 128 + last and err.endswith(f"stopped by {last.name}\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.de"]


def test_a_command_run_from_another_thread_is_not_a_signal_error(tmp_path, capsys):
    """main() called off the main thread (a GUI's or a server's worker): every command but
    those with their own signal handling stopped with "ValueError: signal only works in main
    thread", where the SIGTERM handler of sigterm_as_interrupt was set; it runs without one."""
    codes, handler = [], signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=lambda: codes.append(
        main(["evaluate", "--checkpoint", str(tmp_path / "nowhere")])))
    worker.start()
    worker.join()
    assert codes == [1] and capsys.readouterr().err.startswith("error: ")
    assert signal.getsignal(signal.SIGTERM) is handler  # the main thread's, untouched


@pytest.mark.parametrize("argv", [["translate", "--beam", "x"], ["translat"], ["translate"], []])
def test_a_command_line_argparse_refuses_is_one_line(argv, capsys):
    """Exit status 2 and one line naming the command and its --help, not argparse's usage
    block above it (12 lines for translate)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: nmt")
    assert err.rstrip().endswith("--help)") and "usage:" not in err


def test_version_names_nmt_its_commit_and_its_libraries(capsys):
    """What a bug report needs, on stdout, status 0 (argparse's --help's way)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"nmt {nmt.__version__}") and out.count("\n") == 1
    assert f"torch {torch.__version__}" in out and "lightning " in out and "Python 3." in out
    assert code_commit() is None or f"(commit {code_commit()})" in out


def test_prepare_list_tells_the_prepared_folders_apart(tmp_path, capsys):
    """prepare --list: every folder under <data_dir>/prepared/ with its pairs, vocabulary and
    size, the config's marked; a half-built folder and one without meta.json are listed as
    such; a config whose folder is not there yet says so. Nothing is prepared."""
    files = write_corpus(tmp_path)
    data = tmp_path / "data"
    config = ["--config", "configs/transformer.yaml", f"data.train_files=[{','.join(files['train'])}]",
              f"data.val_files=[{','.join(files['val'])}]", f"data.data_dir={data}"]
    for lines in ("200", "null"):  # null: all of them
        assert main(["prepare", *config, "data.vocab_size=100", f"data.train_lines={lines}"]) == 0
    folders = sorted(path.name for path in (data / "prepared").iterdir())
    (data / "prepared" / f"{folders[0]}.tmp-host-123").mkdir()
    (data / "prepared" / "copied-by-hand").mkdir()
    capsys.readouterr()
    assert main(["prepare", *config, "data.vocab_size=100", "data.train_lines=200", "--list"]) == 0
    rows = {row.split(" | ")[1]: row for row in capsys.readouterr().out.splitlines()
            if row.startswith("| ") and " | " in row[2:]}
    assert len(rows) == 5  # the header, 2 prepared folders, the half-built and the odd one
    marked = [name for name, row in rows.items() if row.startswith("| * |")]
    assert len(marked) == 1 and "| 200 / " in rows[marked[0]] and "| prepared |" in rows[marked[0]]
    other, = set(folders) - set(marked)
    pairs = len(Path(files["train"][0]).read_text(encoding="utf-8").splitlines())
    assert f"| {pairs:,} / " in rows[other] and " MB | " in rows[other]
    assert "being built" in rows[f"{folders[0]}.tmp-host-123"]
    assert "no meta.json" in rows["copied-by-hand"]
    assert main(["prepare", *config, "data.vocab_size=90", "--list"]) == 0
    assert "is not prepared yet" in capsys.readouterr().out.splitlines()[-1]
    assert sorted(path.name for path in (data / "prepared").iterdir()) == sorted(
        [*folders, f"{folders[0]}.tmp-host-123", "copied-by-hand"])  # nothing prepared


def _cleanup_failing_on_a_stop(stop: KeyboardInterrupt, *args, **kwargs):
    """A library that a stop's exception goes through, whose clean-up fails on the state the
    stop left half-built (OmegaConf raised AttributeError so, in ``nmt bench data``)."""
    half_built = None
    try:
        raise stop  # the signal's handler, raising wherever the process was
    finally:
        half_built._invalidate_flags_cache()


@pytest.mark.parametrize("stop, status, line", [
    (Stopped(signal.SIGTERM), 143, "stopped by SIGTERM"),
    (Stopped(signal.SIGHUP), 129, "stopped by SIGHUP"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_a_library_error_raised_as_a_stop_went_through_it_is_the_stop(monkeypatch, capsys, tmp_path,
                                                                      stop, status, line):
    """A command stopped by SIGTERM in the middle of OmegaConf ended in an AttributeError
    traceback, exit 1; it is the stop's line and status."""
    monkeypatch.setattr("nmt.bench_data.bench_data",
                        lambda *args, **kwargs: _cleanup_failing_on_a_stop(stop))
    assert main(["bench", "data", "--dir", str(tmp_path)]) == status
    assert capsys.readouterr().err == line + "\n"


def lightnings_end_of_a_stop(stop: KeyboardInterrupt, *args, **kwargs):
    """What ``trainer.fit`` does with a KeyboardInterrupt (Ctrl-C, or SIGTERM as ``Stopped``)."""
    try:
        raise stop
    except KeyboardInterrupt:
        sys.exit(1)  # its "graceful shutdown"


@pytest.mark.parametrize("stop, status, line", [
    (Stopped(signal.SIGTERM), 143, "stopped by SIGTERM"), (KeyboardInterrupt(), 130, "interrupted")])
def test_lightnings_exit_on_a_stop_is_the_stop(monkeypatch, capsys, stop, status, line):
    """Lightning's sys.exit(1) in trainer.fit, for the KeyboardInterrupt it caught (nmt bench
    train's Ctrl-C exited 1, without a word of ours), is the stop; a sys.exit that no stop
    caused stays what it was."""
    monkeypatch.setattr("nmt.bench.bench_train", lambda *a, **k: lightnings_end_of_a_stop(stop))
    config = str(REPO / "configs" / "transformer.yaml")
    assert main(["bench", "train", "--config", config]) == status
    assert capsys.readouterr().err == line + "\n"
    monkeypatch.setattr("nmt.bench.bench_train", lambda *a, **k: sys.exit(3))
    with pytest.raises(SystemExit, match="3"):
        main(["bench", "train", "--config", config])


def test_an_error_raised_after_a_stop_was_handled_is_not_the_stop(monkeypatch, tmp_path):
    """Only an error raised while the stop propagated is taken for it: one raised once a
    stop was caught and dealt with is the bug it is, a traceback."""
    def handled_then_failed(*args, **kwargs):
        try:
            raise Stopped(signal.SIGTERM)
        except Stopped:
            pass
        raise AttributeError("a bug")

    monkeypatch.setattr("nmt.bench_data.bench_data", handled_then_failed)
    with pytest.raises(AttributeError, match="a bug"):
        main(["bench", "data", "--dir", str(tmp_path)])


def test_a_stop_that_a_library_turned_into_its_error_is_a_servers_clean_end():
    """A server's stop (SIGTERM, Ctrl-C) is its normal end, exit status 0, also where the
    stop's exception went through a library that raised its own; a bug stays a traceback."""
    with stopped_cleanly():
        _cleanup_failing_on_a_stop(KeyboardInterrupt())
    with pytest.raises(AttributeError, match="a bug"), stopped_cleanly():
        raise AttributeError("a bug")
