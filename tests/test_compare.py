"""``nmt compare`` end to end on a tiny study: records, reuse by resolved configuration,
presets kept apart, tables rebuilt from records alone, significance from sacreBLEU and a paired t-test;
and the attention heatmap of known weights."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from nmt.attention_stats import attention_matrix
from nmt.cli import main
from nmt.errors import NMTError
from nmt.plots import draw_attention
from nmt.provenance import code_commit
from nmt.study_report import paired_t_test

from .conftest import REPO, tiny_train_args, write_corpus

TINY_RNN = ["model.emb_dim=16", "model.hidden_size=32", "model.attention_dim=32"]
TINY_TRANSFORMER = ["model.d_model=32", "model.heads=2", "model.ff_dim=64",
                    "model.encoder_layers=1", "model.decoder_layers=1"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Two presets that differ in one option; preset "a" has 2 seeds and a variant group."""
    folder = tmp_path_factory.mktemp("compare")
    files = write_corpus(folder)
    common = [f"data.{split}_files=[{','.join(files[split])}]" for split in ("train", "val", "test")]
    common += [f"data.data_dir={folder / 'data'}", "data.vocab_size=100", "data.max_tokens=600",
               "trainer.max_epochs=1", "trainer.accelerator=cpu"]
    overrides = {"all": common, "rnn": TINY_RNN, "transformer": TINY_TRANSFORMER}
    config = {
        "name": "tiny",
        "families": {"rnn": str(REPO / "configs/rnn_bahdanau.yaml"),
                     "transformer": str(REPO / "configs/transformer.yaml")},
        "baselines": {"rnn": "additive", "transformer": "scaled_dot"},
        "beam": 3, "bootstrap_samples": 200, "plot_sentences": [0, 1],
        "presets": {
            "a": {"overrides": overrides, "groups": {
                "main": {"seeds": 2, "attentions": {"rnn": ["additive", "dot"],
                                                    "transformer": ["scaled_dot"]}},
                "heads": {"attentions": {"transformer": ["scaled_dot", "symmetric"]},
                          "variants": {"h1": {"transformer": ["model.heads=1"]}}}}},
            "b": {"overrides": {**overrides, "all": [*common, "optim.lr=0.0007"]}, "groups": {
                "main": {"attentions": {"rnn": ["additive"]}}}},
        },
    }
    path = folder / "compare.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = folder / "study"

    def run(preset: str, *more: str) -> int:
        return main(["compare", "--config", str(path), "--preset", preset, "--out",
                     str(out / preset), "--runs", str(folder / "runs" / preset), *more])

    assert run("a") == 0
    return run, out, files, folder


def read_rows(out):
    return {(r["group"], r["family"], r["attention"], r["variant"]): r
            for r in json.loads((out / "compare.json").read_text())}


def test_compare_writes_records_tables_and_figures(study):
    _, out, files, folder = study
    a = out / "a"
    for name in ("compare.md", "compare.json", "compare.csv", "figures/bleu.png",
                 "figures/cross_test0001.png", "figures/cross_test0002.png",
                 "figures/encoder_test0001.png"):
        assert (a / name).is_file(), name
    cells = sorted(p.name for p in (a / "cells").iterdir())
    assert cells == sorted(["rnn_additive_seed1", "rnn_additive_seed2", "rnn_dot_seed1", "rnn_dot_seed2",
                            "transformer_scaled_dot_seed1", "transformer_scaled_dot_seed2",
                            "transformer_scaled_dot_h1_seed1", "transformer_symmetric_h1_seed1"])
    record = json.loads((a / "cells" / "transformer_symmetric_h1_seed1" / "record.json").read_text())
    assert record["cell"] == {"group": "heads", "family": "transformer", "attention": "symmetric",
                              "variant": "h1", "seed": 1}
    assert record["config"]["model"]["attention"] == "symmetric" and record["config"]["model"]["heads"] == 1
    assert set(record["attention_stats"]) == {"encoder", "decoder", "cross"}
    assert 0 <= record["attention_stats"]["cross"]["diagonal_mass"] <= 1
    assert record["provenance"]["device"].startswith("CPU") and record["provenance"]["precision"]
    scores = record["scores"]  # lower-cased BLEU named its signature nowhere
    assert scores["bleu_lc_signature"] == scores["bleu_signature"].replace("|case:mixed|", "|case:lc|")
    picture = record["pictures"][0]
    assert len(picture["cross"]) == len(picture["target"])
    assert len(picture["cross"][0]) == len(picture["source"]) == len(picture["encoder"][0])
    rows = read_rows(a)
    dot = rows[("main", "rnn", "dot", "base")]
    assert dot["seeds"] == 2 and len(dot["p_boot"]) == 2 and 0 < dot["p_seeds"] <= 1
    assert rows[("main", "rnn", "additive", "base")]["is_baseline"]
    assert rows[("heads", "transformer", "symmetric", "h1")]["d_k"] == 32
    assert list(rows)[0][0] == "main"
    table = (a / "compare.md").read_text()
    assert "### main" in table and "### heads" in table and "| rnn | dot | base |" in table
    assert f"`, {Path(files['test'][1]).name}, beam search." in table  # not "test2016"
    assert record["test_set"] == Path(files["test"][1]).name  # as scored: the footnote reads it
    # Each cell was trained in one segment, from step 0, by the code of this checkout.
    assert record["train"]["segments"][0]["from_step"] == 0
    commit = (code_commit() or "unknown")[:7]
    assert f"| rnn_dot_seed2 | {commit}" in table and "from 0 (CPU: " in table
    # The scores came from the weights training chose, and the table says which.
    run_dir = next((folder / "runs" / "a").glob("transformer_symmetric_h1_seed1-*"))
    stats = json.loads((run_dir / "train_stats.json").read_text())
    assert record["weights"] == stats["final_weights"]
    assert f"| {record['weights']} | {commit}" in table


def test_significance_is_sacrebleus_bootstrap_and_a_paired_t_test(study, monkeypatch):
    """The p-values are sacreBLEU's bootstrap and the seeds' paired t-test; the footnote gives
    the bootstrap's own signature (it named BLEU's alone: not its resamples, nor their seed)."""
    _, out, files, _ = study
    monkeypatch.setenv("SACREBLEU_SEED", "12345")  # the seed the report pins
    cells = out / "a" / "cells"

    def hyps(name):
        return (cells / name / "hyps.txt").read_text(encoding="utf-8").split("\n")[:-1]

    def bleu(name):
        return json.loads((cells / name / "record.json").read_text())["scores"]["bleu"]

    refs = [line.rstrip("\n") for line in open(files["test"][1], encoding="utf-8")]
    row = read_rows(out / "a")[("main", "rnn", "dot", "base")]
    for seed in (1, 2):
        test = PairedTest([("base", hyps(f"rnn_additive_seed{seed}")), ("dot", hyps(f"rnn_dot_seed{seed}"))],
                          {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=200)
        signatures, results = test()
        assert row["p_boot"][seed - 1] == round(results["BLEU"][1].p_value, 4)
    signature = str(signatures["BLEU"])
    assert "|bs:200|seed:12345|" in signature
    footnote = (out / "a" / "compare.md").read_text()
    assert f"p boot: two-sided paired bootstrap (sacreBLEU `{signature}`; bs: resamples, seed: " \
        "their random seed) per seed" in footnote
    assert "Neither is corrected for multiple comparisons." in footnote  # dozens of tests
    # Two seeds, one degree of freedom: t = (d1 + d2) / |d1 - d2| and p = 1 - 2 atan(|t|) / pi;
    # no t where the differences are equal (1.0 where both are 0)
    d = [bleu(f"rnn_dot_seed{s}") - bleu(f"rnn_additive_seed{s}") for s in (1, 2)]
    if round(d[0], 6) == round(d[1], 6):  # as the report rounds BLEU's 2 decimals' float noise
        expected = 1.0 if round(d[0], 6) == 0 else None
    else:
        expected = round(1 - 2 * math.atan(abs(sum(d) / (d[0] - d[1]))) / math.pi, 4)
    assert row["p_seeds"] == expected


def test_each_cell_is_paired_on_its_own_test_references(study, tmp_path):
    """A variant testing on other files (30 validation pairs): its cells' bootstrap ran
    against the first cell's references (test2016's), a wrong p-value and no word of it."""
    run, out, files, folder = study
    refs = [line.rstrip("\n") for line in open(files["val"][1], encoding="utf-8")][:30]
    other = [tmp_path / "v30.src", tmp_path / "v30.tgt"]
    for path, source in zip(other, files["val"]):
        path.write_text("".join(open(source, encoding="utf-8").readlines()[:30]), encoding="utf-8")
    config = yaml.safe_load((folder / "compare.yaml").read_text())
    config["presets"]["v"] = {"overrides": config["presets"]["a"]["overrides"], "groups": {
        "main": {"attentions": {"rnn": ["additive", "dot"]},
                 "variants": {"base": {}, "onval": {"all": [f"data.test_files=[{other[0]},{other[1]}]"]}}}}}
    changed = tmp_path / "compare.yaml"
    changed.write_text(yaml.safe_dump(config))
    # The base cells are preset a's main cells of seed 1 (same options, same key): their runs
    # are reused, decoded anew, and only the onval cells train (trained here if they are gone)
    for run_dir in (folder / "runs" / "a").glob("rnn_*_seed1-*"):
        shutil.copytree(run_dir, tmp_path / "runs" / run_dir.name)
    assert main(["compare", "--config", str(changed), "--preset", "v", "--out", str(tmp_path / "v"),
                 "--runs", str(tmp_path / "runs")]) == 0
    cells = tmp_path / "v" / "cells"
    hyps = {name: (cells / f"rnn_{name}_onval_seed1" / "hyps.txt").read_text().split("\n")[:-1]
            for name in ("additive", "dot")}
    test = PairedTest([("base", hyps["additive"]), ("dot", hyps["dot"])], {"BLEU": BLEU()},
                      [refs], test_type="bs", n_samples=200)
    row = read_rows(tmp_path / "v")[("main", "rnn", "dot", "onval")]
    assert row["p_boot"] == [round(test()[1]["BLEU"][1].p_value, 4)]
    names = sorted([Path(files["test"][1]).name, "v30.tgt"])
    assert f"each cell's own test set ({', '.join(names)})" in (tmp_path / "v" / "compare.md").read_text()


def test_a_seed_without_its_baseline_has_no_p_value_and_the_others_keep_theirs(study, tmp_path):
    """With seed 1's baseline cell gone, seed 2's p-value was listed first, as seed 1's."""
    run, out, files, folder = study
    shutil.copytree(out / "a", tmp_path / "a", ignore=shutil.ignore_patterns("figures"))
    seed2 = read_rows(tmp_path / "a")[("main", "rnn", "dot", "base")]["p_boot"][1]
    shutil.rmtree(tmp_path / "a" / "cells" / "rnn_additive_seed1")
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "none"), "--tables-only"]) == 0
    assert read_rows(tmp_path / "a")[("main", "rnn", "dot", "base")]["p_boot"] == [None, seed2]
    assert "| - / " + str(seed2) + " |" in (tmp_path / "a" / "compare.md").read_text()


def test_the_footnote_names_every_bleu_signature_the_cells_were_scored_with(study, tmp_path):
    """A cell scored by another sacreBLEU version: the footnote named the first record's
    signature alone, as if every cell's BLEU were of it."""
    run, out, files, folder = study
    shutil.copytree(out / "a", tmp_path / "a", ignore=shutil.ignore_patterns("figures"))
    path = tmp_path / "a" / "cells" / "rnn_dot_seed2" / "record.json"
    record = json.loads(path.read_text())
    ours = record["scores"]["bleu_signature"]
    other = ours.rsplit("|version:", 1)[0] + "|version:1.5.1"
    record["scores"]["bleu_signature"] = other
    path.write_text(json.dumps(record) + "\n")
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "none"), "--tables-only"]) == 0
    footnote = (tmp_path / "a" / "compare.md").read_text()
    assert f"sacreBLEU as each cell was scored (`{other}`, `{ours}`)" in footnote
    assert f"sacreBLEU `{ours}`, " not in footnote  # not the first record's as every cell's


@pytest.mark.parametrize("change", ["a line added", "a line edited"])
def test_references_changed_since_a_cell_was_scored_are_a_one_line_error(study, tmp_path, capsys,
                                                                         change):
    """A test file that gained a line paired each translation with the next one's reference
    (sacreBLEU pairs the shorter list); one edited in place, with another sentence."""
    run, out, files, folder = study
    shutil.copytree(out / "a", tmp_path / "a", ignore=shutil.ignore_patterns("figures"))
    kept = {path: open(path, encoding="utf-8").read() for path in files["test"]}
    try:
        for path, text in kept.items():  # both sides: a corpus whose sides differ is refused
            with open(path, "w", encoding="utf-8") as f:
                f.write("ein neuer satz\n" + text if change == "a line added"
                        else "x\n" + text.split("\n", 1)[1])
        capsys.readouterr()
        assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                     str(tmp_path / "a"), "--runs", str(tmp_path / "none"), "--tables-only"]) == 1
    finally:
        for path, text in kept.items():
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    err = capsys.readouterr().err
    then = "30 sentences then, 31 now" if change == "a line added" else "the same 30 sentences, other text"
    assert f"are not those it was scored on ({then})" in err and err.count("\n") == 1, err


def test_a_trials_record_is_not_replaced_by_another_trial_or_by_the_preset(study, tmp_path, capsys):
    """Records made with an option on the command line (a trial) were replaced without a word
    by a run with other options, or with none: only the preset's own records were kept."""
    run, out, files, folder = study
    shutil.copytree(out / "a", tmp_path / "a", ignore=shutil.ignore_patterns("figures"))
    records = sorted((tmp_path / "a" / "cells").glob("*/record.json"))
    for path in records:  # as a trial with optim.lr=0.002 recorded them
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "key": "0123456789ab", "trial": ["optim.lr=0.002"]}))
    before = [path.read_text() for path in records]
    for more, now in ((["--optim.lr", "0.004"], "optim.lr=0.004"),
                      ([], "the preset's options alone")):
        capsys.readouterr()
        assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a",
                     "--out", str(tmp_path / "a"), "--runs", str(tmp_path / "runs"), *more]) == 1
        err = capsys.readouterr().err
        assert f"made with optim.lr=0.002, which this run with {now} would replace" in err, err
    assert [path.read_text() for path in records] == before
    assert not (tmp_path / "runs").exists()  # refused before anything trained


@pytest.mark.parametrize("recorded,now,same", [
    (["optim.lr=0.002", "seed=3"], ["seed=3", "optim.lr=0.002"], True),  # another order
    (["optim.betas=[0.8,0.9]", "optim.betas.1=0.95"], ["optim.betas=[0.8,0.95]"], True),
    (["optim.lr=0.002", "seed=3"], ["optim.lr=0.002"], False),
    (["seed=3", "seed=4"], ["seed=3"], False),  # the last of an option's values counts
    # options that cannot change a cell: no part of a trial
    (["optim.lr=0.002", "trainer.enable_progress_bar=false"], ["optim.lr=0.002"], True),
    (["optim.lr=0.002"], ["trainer.tensorboard=true", "optim.lr=0.002", "name=x"], True),
    (["optim.lr=0.002"], ["trainer.enable_progress_bar=false"], False),
])
def test_a_trial_is_its_options_not_their_order(recorded, now, same):
    """The same options in another order (or layered otherwise to the same values, or beside
    options that cannot change a cell, such as a progress bar turned off) are the same trial,
    whose record a run with them may replace: it was refused as another trial."""
    from nmt.compare import check_replaceable

    record = {"key": "0123456789ab", "trial": recorded}
    if same:
        check_replaceable(None, "a", None, record, Path("cells/x"), now)
    else:
        with pytest.raises(NMTError, match="holds a record of this cell made with"):
            check_replaceable(None, "a", None, record, Path("cells/x"), now)


def test_a_trial_records_none_of_the_options_that_cannot_change_a_cell(monkeypatch):
    """A trial's record named every option given, a progress bar turned off too: the same
    trial run again without it was refused as another."""
    from nmt import compare

    monkeypatch.setattr(compare, "preset_key", lambda cfg, preset, cell: "the preset's")
    trial = compare.trial_options(None, "a", None, "a trial's", [
        "optim.lr=0.002", "trainer.enable_progress_bar=false", "decoding.precision=bf16-mixed"])
    assert trial == ["optim.lr=0.002"]


def test_a_record_is_not_replaced_by_another_presets_cell_or_a_trial(study, tmp_path, capsys):
    """Records are named by cell, not key: preset b's rnn_additive_seed1 in a's --out, or a run
    with an option given on the command line, replaced the study's record without a word."""
    run, out, files, folder = study
    shutil.copytree(out / "a", tmp_path / "a", ignore=shutil.ignore_patterns("figures"))
    before = (tmp_path / "a" / "cells" / "rnn_additive_seed1" / "record.json").read_text()
    for preset, more, message in (
            ("b", [], "holds preset a's record of this cell, which preset b would replace"),
            ("a", ["--optim.lr", "0.002"], "this run with optim.lr=0.002 would replace")):
        capsys.readouterr()
        assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", preset,
                     "--out", str(tmp_path / "a"), "--runs", str(tmp_path / "runs"), *more]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert (tmp_path / "a" / "cells" / "rnn_additive_seed1" / "record.json").read_text() == before
    assert not (tmp_path / "runs").exists()  # refused before anything trained
    # Tables alone replace nothing: an option there is no trial to refuse
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "runs"), "--tables-only",
                 "--optim.lr", "0.002"]) == 0
    # A changed preset replaces its records, also with options that keep the preset's cells
    changed = yaml.safe_load((folder / "compare.yaml").read_text())
    changed["presets"]["a"]["overrides"]["rnn"] = [*TINY_RNN, "optim.lr=0.0011"]
    changed["presets"]["a"]["groups"]["main"]["attentions"]["rnn"] = ["additive"]  # one to train
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    capsys.readouterr()
    assert main(["compare", "--config", str(tmp_path / "changed.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "runs"), "--seeds", "1",
                 "--max-epochs", "1"]) == 0
    assert "rnn_additive_seed1: its record is of other options" in capsys.readouterr().out


def test_cells_are_reused_only_when_their_configuration_matches(study, capsys):
    run, out, _, folder = study
    capsys.readouterr()
    assert run("a") == 0
    assert capsys.readouterr().out.count("recorded already, reused") == 8
    # A record whose key no longer matches is not reused (its run, under the right key, is).
    stale = out / "a/cells/rnn_dot_seed2/record.json"
    stale.write_text(json.dumps({**json.loads(stale.read_text()), "key": "0" * 12}))
    assert run("a") == 0
    log = capsys.readouterr().out
    assert log.count("recorded already, reused") == 7 and "rnn_dot_seed2: decoding" in log
    # Preset b differs in one option: its cell is another cell, trained anew.
    assert run("b") == 0
    log = capsys.readouterr().out
    assert "rnn_additive_seed1: training" in log and "reused" not in log
    record_a = json.loads((out / "a/cells/rnn_additive_seed1/record.json").read_text())
    record_b = json.loads((out / "b/cells/rnn_additive_seed1/record.json").read_text())
    assert record_a["key"] != record_b["key"] and record_b["config"]["optim"]["lr"] == 0.0007


def test_a_record_of_other_decoding_options_is_decoded_anew(study, tmp_path, capsys):
    """The key covers training alone: with another beam, or other pictured lines, a cell's
    record is decoded anew from its run (it was reused, its beam-3 scores tabled as beam 2's);
    a pictured line past the test set's end is drawn for none (it was an IndexError)."""
    run, out, _, folder = study
    config = yaml.safe_load((folder / "compare.yaml").read_text())
    changed = tmp_path / "compare.yaml"
    changed.write_text(yaml.safe_dump({**config, "beam": 2, "plot_sentences": [1, 99]}))
    assert run("b") == 0  # recorded at beam 3 (trained here unless an earlier test did)
    shutil.copytree(out / "b", tmp_path / "b")
    capsys.readouterr()
    assert main(["compare", "--config", str(changed), "--preset", "b", "--out", str(tmp_path / "b"),
                 "--runs", str(folder / "runs" / "b")]) == 0
    log = capsys.readouterr().out
    assert "rnn_additive_seed1: decoding and recording" in log and "reused" not in log
    assert ": training" not in log  # its run, under the same key, is decoded again
    record = json.loads((tmp_path / "b/cells/rnn_additive_seed1/record.json").read_text())
    assert record["scores"]["beam"] == 2 and [p["line"] for p in record["pictures"]] == [1]
    assert (tmp_path / "b/figures/cross_test0002.png").is_file()
    assert not (tmp_path / "b/figures/cross_test0100.png").exists()
    capsys.readouterr()
    assert main(["compare", "--config", str(changed), "--preset", "b", "--out", str(tmp_path / "b"),
                 "--runs", str(folder / "runs" / "b")]) == 0
    assert "rnn_additive_seed1: recorded already, reused" in capsys.readouterr().out
    # Other pictured lines alone leave the scores as they are: the tables keep the cell.
    changed.write_text(yaml.safe_dump({**config, "beam": 2, "plot_sentences": [0]}))
    assert main(["compare", "--config", str(changed), "--preset", "b", "--out", str(tmp_path / "b"),
                 "--runs", str(tmp_path / "no runs"), "--tables-only"]) == 0
    assert ("main", "rnn", "additive", "base") in read_rows(tmp_path / "b")


class DiesWhenUnpickled:
    """A job argument that ends the worker process that receives it, as an out-of-memory
    kill would."""

    def __reduce__(self):
        return os._exit, (9,)


def test_a_dead_worker_names_the_cells_left_unrecorded_not_failed():
    """A worker killed (out of memory) broke the pool: every cell not recorded yet, also
    those that never started, was reported "failed" with the pool's error."""
    from nmt import compare

    jobs = [(DiesWhenUnpickled(), SimpleNamespace(), SimpleNamespace(name=name)) for name in "ab"]
    with pytest.raises(NMTError, match=r"^a worker process died \(killed, or out of memory\?\), "
                                       r"so 2 cells running or waiting were not recorded: "):
        compare.record_in_parallel(jobs, workers=2)


def test_a_broken_pool_ends_the_trainings_its_other_workers_started(tmp_path):
    """A worker that dies breaks the pool, which ends the other workers (SIGTERM): the
    trainings they had started (subprocess.run) went on alone, holding their runs' locks, so
    the same command again, as the error advises, could not train those cells."""
    import subprocess
    import time
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    from nmt import compare

    pid_file = tmp_path / "pid"
    training = ["sh", "-c", f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 60"]
    with ProcessPoolExecutor(2, mp_context=get_context("spawn"), initializer=compare._start_worker,
                             initargs=(1, os.getpid())) as pool:
        # both workers started first: the pool watches for the death of those it had when a
        # job came (Python 3.11 saw one started with the job only once another job ended)
        for started in [pool.submit(os.getpid) for _ in range(2)]:
            started.result(timeout=60)
        running = pool.submit(compare._in_worker, subprocess.run, training)
        for _ in range(600):
            if pid_file.exists():
                break
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        pool.submit(compare._in_worker, DiesWhenUnpickled())
        with pytest.raises(BrokenProcessPool):
            running.result(timeout=60)
    state = Path(f"/proc/{pid}/stat")
    alive = state.exists() and state.read_text().split(") ")[1][0] != "Z"
    if alive:
        os.kill(pid, 9)
    assert not alive, "the training went on after its worker ended"


def test_cells_train_in_parallel_into_their_own_records(study, capsys):
    """--jobs 2: two new cells train at once, each in its own process, and each record is its
    own cell's (seed, key), as the sequential study would write it."""
    from nmt import compare

    run, out, _, folder = study
    capsys.readouterr()
    assert run("b", "--seeds", "3", "--jobs", "2") == 0
    log = capsys.readouterr().out
    assert "rnn_additive_seed2: recorded" in log and "rnn_additive_seed3: recorded" in log
    cfg = compare.load_compare_config(str(folder / "compare.yaml"))
    for seed in (2, 3):
        record = json.loads((out / f"b/cells/rnn_additive_seed{seed}/record.json").read_text())
        cell = compare.Cell("main", "rnn", "additive", "base", seed)
        key, _ = compare.cell_key(cfg.families["rnn"], compare.cell_overrides(cfg, "b", cell, []))
        assert record["config"]["seed"] == seed and record["key"] == key
    assert read_rows(out / "b")[("main", "rnn", "additive", "base")]["seeds"] == 3


def test_tables_rebuild_from_records_alone(study, capsys):
    run, out, _, folder = study
    before = read_rows(out / "a")
    shutil.rmtree(folder / "runs" / "a")  # no checkpoints left
    (out / "a" / "compare.json").unlink()
    assert run("a", "--tables-only") == 0
    assert read_rows(out / "a") == before
    assert ": training (log: " not in capsys.readouterr().out  # no cell trained again


def test_unknown_preset_is_an_error(study, capsys):
    run, _, _, _ = study
    assert run("nope") == 1
    assert "unknown preset 'nope'; choose one of: a, b" in capsys.readouterr().err


def test_options_training_would_refuse_are_refused_by_tables_only_too(study, capsys):
    run, out, _, _ = study
    before = (out / "a" / "compare.json").read_text()
    assert run("a", "--tables-only", "--model.bogus", "3") == 1
    err = capsys.readouterr().err
    assert "bogus" in err and "Traceback" not in err
    assert (out / "a" / "compare.json").read_text() == before  # the tables stay as they were


def test_a_run_dir_for_the_cells_is_refused(study, tmp_path, capsys):
    """run_dir=DIR sent every cell into one folder: the first trained there, the next failed
    ("no config.yaml in ..."), with --jobs they fought over it."""
    run, out, _, folder = study
    capsys.readouterr()
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "b", "--out",
                 str(tmp_path / "b"), "--runs", str(tmp_path / "runs"), f"run_dir={tmp_path / 'x'}"]) == 1
    err = capsys.readouterr().err
    assert "run_dir is each cell's own" in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


def test_damaged_record_or_compare_config_is_one_line(study, tmp_path, capsys):
    run, out, _, _ = study
    record = out / "a" / "cells" / "rnn_dot_seed1" / "record.json"
    fields = json.loads(record.read_bytes())
    no_scores = json.dumps({**fields, "scores": None}).encode()
    no_train = json.dumps({k: v for k, v in fields.items() if k != "train"}).encode()
    no_bleu = json.dumps({**fields, "scores": {k: v for k, v in fields["scores"].items()
                                               if k != "bleu"}}).encode()

    def refused(path, damages, message):
        """Each damage of ``path`` fails the tables in one line naming it; ``path`` restored."""
        kept = path.read_bytes()
        try:
            for damage in damages:
                path.write_bytes(damage)
                assert run("a", "--tables-only") == 1
                err = capsys.readouterr().err
                assert f"{path} {message}" in err and "Traceback" not in err
        finally:
            path.write_bytes(kept)

    # values of the wrong type, where the tables and figures read them (tracebacks until now)
    hand_edited = [json.dumps({**fields, **change}).encode() for change in (
        {"pictures": [1]}, {"pictures": [{"line": 0}]}, {"attention_stats": {"cross": 5}},
        {"config": {**fields["config"], "model": {}}},
        {"scores": {**fields["scores"], "sentences": "30"}},
        {"scores": {**fields["scores"], "bleu": "12"}},
        {"scores": {**fields["scores"], "chrf": None}},  # its row averaged the other seed alone
        {"scores": {k: v for k, v in fields["scores"].items() if k != "bleu_signature"}},
        {"provenance": {**fields["provenance"], "precision": 5}},
        {"config": {**fields["config"], "model": {"family": "rnn", "hidden_size": "64"}}},
        {"pictures": [{**fields["pictures"][0], "cross": "x"}]},
        {"train": {**fields["train"], "segments": ["x"]}},
        {"train": {**fields["train"], "segments": [{"code": 5, "from_step": 0, "device": None}]}},
        {"pictures": [{**fields["pictures"][0], "cross": [[0.5], [0.5, 0.5]]}]},  # ragged
        {"pictures": [{**fields["pictures"][0], "encoder": "x"}]},
        {"pictures": [{**fields["pictures"][0], "source": 5}]},
        {"pictures": [{**fields["pictures"][0], "cross": [[1, 0]]}]},  # integers: .mean() fails
        {"attention_stats": {"cross": {"entropy": "x"}}}, {"test_set": 5},
        # the options of a trial, read where a run would replace the record (check_replaceable)
        {"trial": None}, {"trial": "optim.lr=0.002"}, {"trial": [1]})]
    refused(record, (b'{"key": ', b"[1, 2]", b"\xff\xfe", no_scores, no_train, no_bleu,
                     *hand_edited), "is not a cell's record")
    cost = out / "a" / "cost.json"
    cost.write_text("{}")
    try:
        refused(cost, (b"{", b"{}", b"[]"), "is not compare --cost's measurement")
    finally:
        cost.unlink()
    hyps = record.parent / "hyps.txt"  # the significance tests pair its lines with the others'
    translations = hyps.read_bytes()
    refused(hyps, (translations[: translations.rindex(b"\n", 0, -1) + 1], b"\xff\xfe\n"),
            "is not the cell's")
    bad = tmp_path / "compare.yaml"
    for text in ("presets: [a: b", "\udcff", "[1, 2]", "presets: {a: {groups: [1]}}", "beam: 0",
                 "plot_sentences: [-1]"):
        bad.write_text(text, errors="surrogateescape")
        assert main(["compare", "--config", str(bad), "--preset", "a", "--tables-only"]) == 1
        err = capsys.readouterr().err
        assert f"bad compare config {bad}" in err and "Traceback" not in err
    bad.write_text("name: empty\n")
    assert main(["compare", "--config", str(bad), "--preset", "a", "--tables-only"]) == 1
    assert "the compare config defines no presets" in capsys.readouterr().err


def test_heatmap_of_known_alignment_has_shape_and_labels():
    import matplotlib.pyplot as plt

    weights = torch.eye(3)  # target piece i attends to source piece i
    per_head = torch.stack([weights, weights.flip(1)], dim=1).unsqueeze(1)  # (T, L=1, H=2, S)
    torch.testing.assert_close(attention_matrix(per_head, 0, 0), weights)
    torch.testing.assert_close(attention_matrix(per_head, 0, None), (weights + weights.flip(1)) / 2)
    fig, ax = plt.subplots()
    draw_attention(ax, weights, ["▁ein", "▁Hund", "</s>"], ["▁a", "▁dog", "</s>"], "known")
    image = ax.images[0].get_array()
    assert image.shape == (3, 3) and (image.argmax(1) == [0, 1, 2]).all()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["▁ein", "▁Hund", "</s>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["▁a", "▁dog", "</s>"]
    assert ax.get_title() == "known"
    plt.close(fig)


def made_up_bench(asked: list):
    """A stand-in for ``nmt.study_cost._bench``: notes what nmt bench was asked (``asked``) and
    answers a summary of the right shape, each training with an MFU of its own (0.1, 0.2, ...)."""
    from nmt import study_cost

    def bench(arguments: list[str]) -> dict:
        asked.append(arguments)
        if arguments[0] == "attention":
            rows = [{"scorer": name, "length": n, "ms": 0.01 * n, "peak_mb": 0.5}
                    for name in ("dot", "additive_deep") for n in (16, 32)]
            return {"rows": rows, "batch": 2, "heads": 4, "head_dim": 32}
        return {**dict.fromkeys(study_cost.TRAIN_KEYS, 1), "mfu": 0.1 * len(asked)}

    return bench


def test_cost_is_benched_per_scorer_baselines_first_and_tabled(study, monkeypatch):
    """compare --cost benches each (family, scorer) of the main group once, the baselines
    first, and tables the numbers under the cells'. What nmt bench answers is made up here:
    test_cost_is_read_from_what_nmt_bench_measures runs the real one."""
    from nmt import study_cost
    from nmt.compare import load_compare_config

    run, out, _, folder = study
    asked = []
    monkeypatch.setattr(study_cost, "_bench", made_up_bench(asked))
    cfg = load_compare_config(str(folder / "compare.yaml"))
    cost = study_cost.measure_cost(cfg, "a", out / "a", steps=2, warmup=1, max_len=32)
    assert [(r["family"], r["attention"]) for r in cost["train"]] == [
        ("rnn", "additive"), ("transformer", "scaled_dot"), ("rnn", "dot")]  # baselines first
    assert [arguments[:3] for arguments in asked] == [
        ["train", "--config", cfg.families[family]] for family in ("rnn", "transformer", "rnn")
    ] + [["attention", "--max-len", "32"]]
    assert run("a", "--tables-only") == 0
    table = (out / "a" / "compare.md").read_text().split("### cost")[1]
    assert "| transformer | scaled_dot |" in table and "| 0.2 |" in table  # the MFU column
    assert cost["options"] == [] and table.startswith(" (`nmt bench train`, 2 steps each, quiet")


def test_cost_is_read_from_what_nmt_bench_measures(study, tmp_path):
    """compare --cost with the real nmt bench, a process for each bench: preset "b"'s one
    scorer; its summaries carry every field the cost file and its table read."""
    from nmt.compare import load_compare_config
    from nmt.study_cost import measure_cost
    from nmt.study_report import cost_table

    _, _, _, folder = study
    cost = measure_cost(load_compare_config(str(folder / "compare.yaml")), "b", tmp_path, steps=2,
                        warmup=1, max_len=32)
    [row] = cost["train"]
    assert (row["family"], row["attention"]) == ("rnn", "additive")
    assert row["tgt_tok_per_s"] > 0 and 0 < row["mfu"] and row["precision"] == "32-true"
    assert None not in row.values() and row["device"].startswith("CPU: ")
    assert {r["scorer"] for r in cost["attention"]["rows"]} >= {"additive_deep", "symmetric"}
    assert (tmp_path / "figures" / "cost_attention.png").is_file()
    assert f"| rnn | additive | {row['tgt_tok_per_s']} |" in cost_table(tmp_path / "cost.json", [])


def test_cost_names_the_options_it_was_benched_with(tmp_path):
    """compare --cost with a trial's options (--train-lines 2000, a smaller model) wrote a
    cost.json that said nothing of them, tabled later beside any run's BLEU."""
    from nmt.study_report import cost_table

    train = {"family": "rnn", "attention": "dot", "tgt_tok_per_s": 10.0, "sec_per_step": 1.5,
             "train_gflop_per_tgt_token": 0.1, "mfu": 0.2, "peak_rss_mb": 99.0, "precision": "32-true"}
    attention = {"rows": [{"scorer": "dot", "length": n, "ms": 0.1 * n, "peak_mb": 0.5}
                          for n in (16, 32)], "batch": 2, "heads": 4, "head_dim": 32}
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"cpu": "a CPU", "measured": "today", "steps": 2, "train": [train],
                                "options": ["data.train_lines=2000", "model.hidden_size=64"],
                                "attention": attention}))
    table = cost_table(path, [])
    assert table.startswith("### cost (`nmt bench train`, 2 steps each with data.train_lines=2000 "
                            "model.hidden_size=64, quiet machine: a CPU, today)")


def test_cost_tables_a_scorer_that_ran_out_of_memory(tmp_path):
    """compare --cost keeps bench attention's rows, where a point that did not fit is a row
    with an error and no numbers (the scorer's last). The report read them as numbers and
    called the file compare wrote itself "not compare --cost's measurement; delete it": every
    measurement again would be refused the same way."""
    from nmt.bench_attention import scorer_exponents
    from nmt.study_report import cost_table

    def point(scorer, length, ms, peak_mb):
        return {"scorer": scorer, "length": length, "ms": ms, "peak_mb": peak_mb}

    rows = [point("additive", 16, 0.3, 40.0), point("additive", 32, 0.5, 80.0),
            point("additive", 64, 22.5, 330.0),
            {"scorer": "additive", "length": 128, "ms": None, "peak_mb": None, "error": "out of memory"},
            *(point("dot", n, 0.1 * n, 0.5) for n in (16, 32, 64, 128))]
    train = {"family": "rnn", "attention": "dot", "tgt_tok_per_s": 10.0, "sec_per_step": 1.5,
             "train_gflop_per_tgt_token": 0.1, "mfu": 0.2, "peak_rss_mb": 99.0, "precision": "32-true"}
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"cpu": "a CPU", "measured": "today", "steps": 2, "train": [train],
                                "attention": {"rows": rows, "batch": 2, "heads": 4, "head_dim": 32}}))
    table = cost_table(path, [{"group": "main", "family": "rnn", "attention": "dot",
                               "variant": "base", "bleu": 30.0}])
    assert "| rnn | dot | 10.0 | 1.5 | 0.1 | 0.2 | 99.0 | 32-true | 30.0 |" in table
    additive = scorer_exponents(rows[:3])["additive"]  # of the points measured, as the bench's
    assert (f"peak MB at length 128: additive k={additive['time']} m={additive['memory']} "
            "out of memory at length 128, dot k=1.0 m=- 0.5 MB") in table


def test_cost_names_the_gpu_its_training_steps_were_timed_on(tmp_path):
    """compare --cost on a GPU machine times training on the GPU and the scorers alone on the
    CPU; the table named the CPU alone as the machine (study/study/cost_h100.json, measured on
    an H100, says an Intel Xeon)."""
    from nmt.study_cost import cost_markdown

    row = {"family": "rnn", "attention": "dot", "tgt_tok_per_s": 10.0, "sec_per_step": 0.08,
           "train_gflop_per_tgt_token": 0.1, "mfu": 0.2, "peak_rss_mb": 99.0,
           "precision": "bf16-mixed", "device": "NVIDIA H100 80GB HBM3"}
    cost = {"cpu": "Intel Xeon", "measured": "today", "steps": 20, "train": [row],
            "attention": {"rows": [{"scorer": "dot", "length": n, "ms": 0.1 * n, "peak_mb": 0.5}
                                   for n in (16, 32)], "batch": 2, "heads": 4, "head_dim": 32}}
    cells = [{"group": "main", "family": "rnn", "attention": "dot", "variant": "base", "bleu": 30.0}]
    table = cost_markdown(cost, cells)
    assert ("quiet machine: NVIDIA H100 80GB HBM3, host CPU Intel Xeon, today)" in table
            and "Scorers alone (`nmt bench attention`, on the CPU): " in table)
    # on a CPU, and in files from before the rows named their device: the CPU, as before
    for device in ("CPU: Intel Xeon", None):
        cost["train"] = [{**row, "device": device}] if device else [
            {k: v for k, v in row.items() if k != "device"}]
        table = cost_markdown(cost, cells)
        assert ("quiet machine: Intel Xeon, today)" in table
                and "Scorers alone (`nmt bench attention`): " in table)


def test_two_groups_making_one_cell_name_are_an_error(study, tmp_path, capsys):
    """Groups short and long, each with a variant big of the same scorer: their records would
    share one folder, each run replacing the other's. One line instead, before any training."""
    _, _, _, folder = study
    config = yaml.safe_load((folder / "compare.yaml").read_text())
    variant = {"big": {"rnn": ["model.hidden_size=48"]}}
    config["presets"]["c"] = {"groups": {
        "short": {"attentions": {"rnn": ["additive"]}, "variants": variant},
        "long": {"attentions": {"rnn": ["additive"]}, "variants": variant}}}
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["compare", "--config", str(path), "--preset", "c", "--out", str(tmp_path / "c"),
                 "--runs", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert err == ("error: preset c: groups short and long both make cell rnn_additive_big_seed1 "
                   "(variant big): name their variants apart\n")
    assert not (tmp_path / "runs").exists()
    config["presets"]["c"] = {"groups": {"main": {"attentions": {"rnn": ["additive", "additive"]}}}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert main(["compare", "--config", str(path), "--preset", "c", "--out", str(tmp_path / "c"),
                 "--runs", str(tmp_path / "runs")]) == 1
    assert capsys.readouterr().err == ("error: preset c: group main lists cell "
                                       "rnn_additive_seed1 twice\n")


def test_cost_is_benched_with_the_command_lines_options_as_the_cells(study, monkeypatch, capsys,
                                                                     tmp_path):
    """compare --cost OPTION: each scorer's training is benched with the option, as the cells
    it is tabled beside were trained (it was benched with the preset's options alone). The
    cells are planned once (they were planned twice: 4 s for the study's 48 cells)."""
    from nmt import compare, study_cost

    run, out, _, folder = study
    calls, plans = [], []
    plan = compare.planned_jobs
    monkeypatch.setattr(compare, "planned_jobs", lambda *args, **kwargs: plans.append(args) or
                        plan(*args, **kwargs))

    monkeypatch.setattr(study_cost, "_bench", made_up_bench(calls))
    # its own --out: a trial's option would replace the study's records (refused)
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "b", "--out",
                 str(tmp_path / "b"), "--runs", str(tmp_path / "runs"), "--cost",
                 "optim.lr=0.0009"]) == 0
    trains = [arguments for arguments in calls if arguments[0] == "train"]
    assert trains and all("optim.lr=0.0009" in arguments for arguments in trains)
    assert len(plans) == 1


def test_committed_study_records_still_match_their_cells():
    """The published study accumulates over many sessions: each committed record must keep
    the key its cell resolves to now, or ``nmt compare --preset study`` would retrain it. A new
    option must keep the resolved configuration of existing cells: be listed in NOT_IN_KEY
    when it cannot change a record, or in ADDED_SINCE with the value the study pins."""
    from nmt import compare

    cfg = compare.load_compare_config(str(REPO / "configs" / "compare.yaml"))
    cells = {cell.name: cell for cell in compare.cells_of(cfg, "study", None)}
    records = sorted((REPO / "study" / "study" / "cells").glob("*/record.json"))
    if not records:
        pytest.skip("no study record committed yet")
    for path in records:
        record = json.loads(path.read_text())
        cell = cells[record["name"]]
        overrides = compare.cell_overrides(cfg, "study", cell, [])
        key, _ = compare.cell_key(str(REPO / cfg.families[cell.family]), overrides)
        assert key == record["key"], f"{record['name']}: its configuration changed"
        assert compare.scored_as_asked(record, cfg) and compare.pictured_as_asked(record, cfg), \
            f"{record['name']}: decoded otherwise"


def test_the_committed_study_names_where_each_cell_ran_as_the_code_tables_it(monkeypatch):
    """The published study's compare.md is rebuilt from its records by ``nmt compare --preset
    study --tables-only``; its 'where each cell ran' section must be what the code now makes
    of those records (it went stale once, when a column was added)."""
    from nmt.compare import load_compare_config
    from nmt.study_report import current_records, provenance_markdown

    monkeypatch.chdir(REPO)  # the config names its families' configs relative to the repository
    study = REPO / "study" / "study"
    records, left_out = current_records(load_compare_config(REPO / "configs" / "compare.yaml"), "study",
                                        study)
    assert len(records) == 48 and left_out == []
    assert provenance_markdown(records) in (study / "compare.md").read_text()


def test_a_cost_measurement_of_no_length_spread_is_one_line(tmp_path):
    """Two timings of a scorer at one length: fitting its growth divided by zero, a
    ZeroDivisionError past the table's check."""
    from nmt.study_report import cost_table

    cost = json.loads((REPO / "study" / "study" / "cost.json").read_text())
    cost["attention"]["rows"] += [{"scorer": "x", "length": 512, "ms": 1.0, "peak_mb": 0.0}] * 2
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(cost))
    rows = json.loads((REPO / "study" / "study" / "compare.json").read_text())
    with pytest.raises(NMTError, match="is not compare --cost's measurement"):
        cost_table(path, rows)


def test_a_family_is_known_by_its_model_not_its_label():
    """A Transformer labelled "tf" in the compare config: its head size was read as an RNN's
    hidden_size, a KeyError after every cell had trained."""
    from types import SimpleNamespace

    from nmt.compare import Cell
    from nmt.study_report import summarise

    record = {"scores": {"bleu": 30.0, "chrf": 50.0}, "attention_stats": {},
              "config": {"model": {"family": "transformer", "d_model": 32, "heads": 2}},
              "train": {"parameters": 1, "steps": 1}, "decode_sent_per_s": 1.0}
    cfg = SimpleNamespace(baselines={"tf": "scaled_dot"})
    [row] = summarise(cfg, {Cell("main", "tf", "scaled_dot", "base", 1): record}, {})
    assert row["d_k"] == 16 and row["family"] == "tf"


def test_a_row_names_the_range_of_its_seeds_steps():
    """Early stopping ends each seed at its own update: the row showed the first seed's."""
    from nmt.compare import Cell
    from nmt.study_report import summarise

    def record(steps: int) -> dict:
        return {"scores": {"bleu": 30.0, "chrf": 50.0}, "attention_stats": {},
                "config": {"model": {"family": "transformer", "d_model": 32, "heads": 2}},
                "train": {"parameters": 1, "steps": steps}, "decode_sent_per_s": 1.0}

    cfg = SimpleNamespace(baselines={"tf": "scaled_dot"})
    records = {Cell("main", "tf", "scaled_dot", "base", seed): record(steps)
               for seed, steps in ((1, 900), (2, 700), (3, 800))}
    [row] = summarise(cfg, records, {})
    assert row["steps"] == "700-900"
    [row] = summarise(cfg, {cell: record(800) for cell in records}, {})
    assert row["steps"] == 800


def test_a_new_familys_records_are_read_and_tabled(toy_registries, tmp_path):
    """A new family's cells trained and recorded, and then their records read as damaged (the
    check wanted an RNN's hidden_size or a Transformer's d_model and heads) and the tables would
    have been a KeyError: d_k is read from the model the record's config builds."""
    from nmt.compare import Cell
    from nmt.study_cell import RECORD, read_record
    from nmt.study_report import summarise

    record = json.loads((REPO / "study/study/cells/rnn_dot_seed1" / RECORD).read_text())
    record["config"]["model"] = {"family": "toy", "emb_dim": 24}  # no attention: its default
    (tmp_path / RECORD).write_text(json.dumps(record))
    read = read_record(tmp_path)
    cfg = SimpleNamespace(baselines={"toy": "toy_cosine"})
    [row] = summarise(cfg, {Cell("main", "toy", "toy_cosine", "base", 1): read}, {})
    assert row["d_k"] == 24 and row["family"] == "toy"


def test_a_figure_of_cells_no_longer_tabled_is_removed(study, tmp_path):
    """Seed 1's cells gone, their cross-attention pictures stayed beside the new tables."""
    _, out, _, folder = study
    shutil.copytree(out / "a", tmp_path / "a")
    assert (tmp_path / "a" / "figures" / "cross_test0001.png").is_file()
    for cell in (tmp_path / "a" / "cells").glob("*_seed1"):
        shutil.rmtree(cell)
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "none"), "--tables-only"]) == 0
    figures = tmp_path / "a" / "figures"
    assert (figures / "bleu.png").is_file() and not (figures / "cross_test0001.png").exists()
    assert not (figures / "encoder_test0001.png").exists()
    # a line no longer pictured: its pictures go too
    config = yaml.safe_load((folder / "compare.yaml").read_text())
    (tmp_path / "one.yaml").write_text(yaml.safe_dump({**config, "plot_sentences": [0]}))
    shutil.rmtree(tmp_path / "a")
    shutil.copytree(out / "a", tmp_path / "a")
    assert (figures / "cross_test0002.png").is_file()
    assert main(["compare", "--config", str(tmp_path / "one.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "none"), "--tables-only"]) == 0
    assert (figures / "cross_test0001.png").is_file() and not (figures / "cross_test0002.png").exists()


def test_tables_rebuilt_from_the_same_records_keep_their_attention_pictures(study, tmp_path):
    """--tables-only drew every attention grid again from unchanged records (the study's: most
    of its time). They are kept; a grid whose cells' pictures changed is drawn again."""
    _, out, _, folder = study
    shutil.copytree(out / "a", tmp_path / "a")
    figures = tmp_path / "a" / "figures"
    grids = ("cross_test0001.png", "cross_test0002.png", "encoder_test0001.png")

    def inodes() -> dict:  # a file written anew, in place or replaced, differs in one of them
        return {name: ((figures / name).stat().st_ino, (figures / name).stat().st_mtime_ns)
                for name in grids}

    def tables() -> None:
        assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                     str(tmp_path / "a"), "--runs", str(tmp_path / "none"), "--tables-only"]) == 0

    before = inodes()
    tables()
    assert inodes() == before
    # an RNN cell's picture of line 1 changed: its cross-attention grid alone is drawn again
    path = tmp_path / "a" / "cells" / "rnn_dot_seed1" / "record.json"
    record = json.loads(path.read_text())
    picture = next(p for p in record["pictures"] if p["line"] == 0)
    picture["cross"] = picture["cross"][::-1]
    path.write_text(json.dumps(record))
    tables()
    after = inodes()
    assert after["cross_test0001.png"] != before["cross_test0001.png"]
    assert {name: after[name] for name in grids[1:]} == {name: before[name] for name in grids[1:]}


def test_cells_that_differ_in_their_variant_alone_are_told_apart_in_the_figures(tmp_path,
                                                                               monkeypatch):
    """Two cells of the main group with one family and scorer, two variants: the BLEU bars
    and the attention panels were both labelled transformer/dot."""
    from types import SimpleNamespace

    from nmt import study_figures
    from nmt.compare import Cell

    drawn = {}
    monkeypatch.setattr(study_figures, "save_bar_chart",
                        lambda path, labels, *args: drawn.update(bars=labels))
    monkeypatch.setattr(study_figures, "save_attention_grid",
                        lambda path, panels, columns: drawn.setdefault(path.name, [
                            p[0] for p in panels if p is not None]))
    picture = {"line": 0, "source": ["a", "b"], "target": ["x"], "cross": [[0.5, 0.5]],
               "encoder": [[[1.0, 0.0], [0.0, 1.0]]]}
    records, rows = {}, []
    for variant in ("base", "wide"):
        records[Cell("main", "transformer", "dot", variant, 1)] = {"pictures": [picture]}
        rows.append({"group": "main", "family": "transformer", "attention": "dot",
                     "variant": variant, "bleu": 30.0, "bleu_std": None})
    cfg = SimpleNamespace(plot_sentences=[0], families={"transformer": "configs/transformer.yaml"})
    study_figures.draw_figures(cfg, records, rows, tmp_path)
    assert drawn["bars"] == ["transformer/dot", "transformer/dot (wide)"]
    assert drawn["cross_test0001.png"] == ["transformer / dot", "transformer / dot (wide)"]
    assert drawn["encoder_test0001.png"] == ["dot head 0", "dot mean", "dot (wide) head 0",
                                             "dot (wide) mean"]


def test_a_record_whose_pictures_alone_differ_is_not_trained_again_without_its_run(
        study, tmp_path, capsys):
    """plot_sentences changed where the cells' runs are not (a clone of the committed study):
    compare trained every cell again (hours for the study preset) to draw the new pictures,
    and replaced each record's scores with the new training's."""
    _, out, _, folder = study
    config = yaml.safe_load((folder / "compare.yaml").read_text())
    changed = tmp_path / "compare.yaml"
    changed.write_text(yaml.safe_dump({**config, "plot_sentences": [0]}))
    shutil.copytree(out / "a" / "cells", tmp_path / "a" / "cells")
    records = {path: path.read_text() for path in (tmp_path / "a").glob("cells/*/record.json")}
    capsys.readouterr()
    assert main(["compare", "--config", str(changed), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "runs")]) == 0
    log = capsys.readouterr().out
    assert ": training (" not in log and not (tmp_path / "runs").exists()
    assert "rnn_dot_seed2: recorded already, reused, with its pictures of other test lines" in log
    assert {path: path.read_text() for path in records} == records
    assert (tmp_path / "a" / "compare.md").is_file()


def test_encoder_pictures_keep_one_row_per_cell_whatever_its_heads(tmp_path, monkeypatch):
    """Cells of 1 and 2 heads: the grid had 3 columns (2 heads and the mean), and the 2-head
    cell's first panel went on the 1-head cell's row, beside its mean."""
    from nmt import study_figures
    from nmt.compare import Cell

    grids = []
    monkeypatch.setattr(study_figures, "save_attention_grid",
                        lambda path, panels, columns: grids.append((panels, columns)))
    eye = [[1.0, 0.0], [0.0, 1.0]]
    records = {Cell("main", "transformer", "dot", variant, 1): {"pictures": [{
        "line": 0, "source": ["a", "b"], "target": ["x"], "cross": [[0.5, 0.5]],
        "encoder": [eye] * heads}]} for variant, heads in (("h1", 1), ("h2", 2))}
    study_figures.draw_encoder(records, 0, tmp_path / "encoder.png")
    (panels, columns), = grids
    rows = [[p[0] if p else None for p in panels[i:i + columns]]
            for i in range(0, len(panels), columns)]
    assert rows[:2] == [["dot (h1) head 0", "dot (h1) mean", None],
                        ["dot (h2) head 0", "dot (h2) head 1", "dot (h2) mean"]]
    assert all(title is None for row in rows[2:] for title in row)


def test_a_record_stopped_between_its_two_files_leaves_the_cell_undone(tmp_path, monkeypatch):
    """Recording a cell again wrote its new translations, then its record: stopped between
    the two, the cell stood done with the earlier record's scores beside other translations."""
    from types import SimpleNamespace

    from nmt import study_cell
    from nmt.compare import Cell

    files = write_corpus(tmp_path)
    run_dir = tmp_path / "run"
    assert main(tiny_train_args(files, run_dir, tmp_path / "data", epochs=1)) == 0
    record_dir = tmp_path / "cell"
    record_dir.mkdir()
    (record_dir / study_cell.RECORD).write_text("{}\n")  # an earlier recording's
    written = study_cell.write_atomic

    def stopped_before_the_record(path, text):
        if path.name == study_cell.RECORD:
            raise KeyboardInterrupt
        written(path, text)

    monkeypatch.setattr(study_cell, "write_atomic", stopped_before_the_record)
    with pytest.raises(KeyboardInterrupt):
        study_cell.finish_cell(SimpleNamespace(beam=1, plot_sentences=[]), "a",
                               Cell("main", "rnn", "additive", "base", 1), "key", {}, run_dir,
                               record_dir)
    assert (record_dir / study_cell.HYPOTHESES).is_file()
    assert not (record_dir / study_cell.RECORD).exists()  # not done: compare records it again


@pytest.mark.parametrize("preset,message", [
    ({"overrides": {"tranformer": ["model.d_model=128"]},
      "groups": {"main": {"attentions": {"transformer": ["dot"]}}}},
     "its overrides names 'tranformer'"),
    ({"groups": {"head_size": {"attentions": {"transformer": ["dot"]},
                               "variants": {"dk16": {"tranformer": ["model.heads=16"]}}}}},
     "group head_size's variant dk16 names 'tranformer'"),
])
def test_overrides_for_no_family_are_an_error(tmp_path, capsys, preset, message):
    """Overrides are keyed all or by family: under a misspelt family they applied to no cell,
    and the cells of variant dk16 trained as the base one (4 heads), under dk16's name."""
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({
        "families": {"rnn": str(REPO / "configs/rnn_bahdanau.yaml"),
                     "transformer": str(REPO / "configs/transformer.yaml")},
        "presets": {"x": preset}}))
    assert main(["compare", "--config", str(path), "--preset", "x", "--out", str(tmp_path / "x"),
                 "--runs", str(tmp_path / "runs")]) == 1
    assert capsys.readouterr().err == (f"error: preset x: {message}, neither all nor a family (rnn, "
                                       "transformer): its overrides would apply to no cell\n")
    assert not (tmp_path / "runs").exists()


def test_a_group_of_no_seeds_is_an_error(tmp_path, capsys):
    """seeds: 0 made no cell of the group, and compare said nothing but "nothing to table"."""
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({"presets": {"x": {"groups": {
        "main": {"seeds": 0, "attentions": {"rnn": ["dot"]}}}}}}))
    assert main(["compare", "--config", str(path), "--preset", "x", "--out", str(tmp_path / "x"),
                 "--runs", str(tmp_path / "runs")]) == 1
    assert capsys.readouterr().err == "error: preset x: group main has seeds 0: at least 1\n"


def test_a_table_write_that_fails_keeps_the_csv_before(study, monkeypatch):
    """compare.csv was rewritten in place (compare.md and .json atomically): a write that
    failed part of the way (a full disk) left it cut short."""
    import csv

    run, out, _, _ = study
    before = (out / "a" / "compare.csv").read_text()

    def disk_full(self, rows):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", disk_full)
    assert run("a", "--tables-only") == 1  # one line: cannot write compare.csv
    assert (out / "a" / "compare.csv").read_text() == before


def test_parallel_cells_share_the_cpus_this_process_may_use(monkeypatch):
    """--jobs divided the machine's core count among its workers, not the CPUs a container or
    taskset leaves this process: 64 cores seen, 4 allowed, 2 workers ran 32 threads each."""
    import os

    from nmt.compare import threads_per_worker

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert [threads_per_worker(n) for n in (1, 2, 3, 8)] == [4, 2, 1, 1]


def test_tables_say_which_records_they_leave_out(study, capsys):
    """A record scored at another beam (or trained with options the preset no longer gives)
    was left out of --tables-only's tables without a word: a baseline left out so took its
    rivals' p-values with it."""
    _, out, _, folder = study
    config = yaml.safe_load((folder / "compare.yaml").read_text())
    config["beam"] = 5
    other = folder / "beam5.yaml"
    other.write_text(yaml.safe_dump(config, sort_keys=False))
    before = (out / "a" / "compare.md").read_text()
    capsys.readouterr()
    assert main(["compare", "--config", str(other), "--preset", "a", "--out", str(out / "a"),
                 "--runs", str(folder / "no_runs"), "--tables-only"]) == 0  # none to decode anew
    printed = capsys.readouterr().out
    (note,) = [line for line in printed.splitlines() if line.startswith("Left out of the tables")]
    cells = sorted(path.name for path in (out / "a" / "cells").iterdir())
    assert note.startswith("Left out of the tables, recorded otherwise than this command asks: ")
    assert sorted(note.rstrip(".").split(": ", 1)[1].split("; ")) == [f"{cell} (scored at beam 3, not 5)"
                                                          for cell in cells]
    assert "no cell recorded as this command asks: nothing to table" in printed
    assert (out / "a" / "compare.md").read_text() == before


def test_tables_name_the_options_of_a_trials_records_they_leave_out(study, tmp_path, capsys):
    """A study shrunk with --train-lines, then tabled with --tables-only alone, left every cell
    out "recorded as the preset no longer asks: ... (trained with other options)": the preset
    had not changed, and nothing said that the same options table them."""
    _, out, _, folder = study
    shutil.copytree(out / "a", tmp_path / "a", ignore=shutil.ignore_patterns("figures"))
    for path in (tmp_path / "a" / "cells").glob("*/record.json"):  # as a trial recorded them
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "key": "0123456789ab",
                                    "trial": ['data.train_lines="20"']}))
    capsys.readouterr()
    assert main(["compare", "--config", str(folder / "compare.yaml"), "--preset", "a", "--out",
                 str(tmp_path / "a"), "--runs", str(tmp_path / "runs"), "--tables-only"]) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines()
               if line.startswith("Left out of the tables")]
    assert 'rnn_dot_seed1 (made with data.train_lines="20": give the same options to table it)' \
        in note, note


def test_p_values_of_seeds_other_than_1_to_n_name_their_seeds():
    """A cell recorded for seeds 2 and 3 listed its two p-values as "p / p" under "p boot
    (per seed)", read as seeds 1 and 2."""
    from nmt.study_report import _cell_text

    row = {"is_baseline": False, "p_boot": [0.01, None], "seed_numbers": [2, 3]}
    assert _cell_text(row, "p_boot") == "seed 2: 0.01 / seed 3: -"
    assert _cell_text({**row, "seed_numbers": [1, 2]}, "p_boot") == "0.01 / -"


def test_a_system_identical_to_its_baseline_is_not_significant():
    """sacreBLEU's paired bootstrap gives a system that translates every sentence as the
    baseline its smallest p, 1 / (samples + 1): 0.001 in the table, read as significant."""
    from nmt.study_report import paired_bootstrap

    refs = ["a dog runs in the snow .", "two men play football .", "a girl reads a book ."]
    baseline = ["a dog runs in snow .", "two men play soccer .", "a girl reads a book ."]
    other = ["a cat sits .", "two men play soccer .", "a girl reads ."]
    found, _ = paired_bootstrap(baseline, {"copy": list(baseline), "other": other}, refs, 100)
    assert found["copy"] == 1.0
    assert 0 < found["other"] < 1.0


def test_a_system_of_the_baselines_bleu_is_not_significant():
    """Two systems that translate differently but score the same BLEU on every resample (both
    0, as a smoke test's cells) got sacreBLEU's smallest p, 1 / (samples + 1): 0.0099 in the
    table at 100 resamples, read as significant."""
    from nmt.study_report import paired_bootstrap

    refs = ["a dog runs in the snow .", "two men play football .", "a girl reads a book ."]
    baseline = ["cat", "house", "tree"]
    other = ["blue", "green", "red"]  # another text, no n-gram of the references either
    assert BLEU().corpus_score(baseline, [refs]).score == BLEU().corpus_score(other, [refs]).score
    found, _ = paired_bootstrap(baseline, {"other": other}, refs, 100)
    assert found["other"] == 1.0


def test_the_bootstrap_draws_with_the_projects_seed_whatever_sacrebleu_seed_says(monkeypatch):
    """sacreBLEU's paired bootstrap reads its seed from $SACREBLEU_SEED: a user who had set it
    got other p-values than the committed ones, with no sign of why."""
    from nmt.study_report import paired_bootstrap

    refs = [f"a dog number {i} runs in the snow ." for i in range(60)]
    # two systems of about the same BLEU: a p-value far from its bounds, where seeds differ
    baseline = [f"a dog {i} runs ." if i % 5 == 0 else ref for i, ref in enumerate(refs)]
    other = [f"dog {i} in the snow ." if i % 4 == 1 else ref for i, ref in enumerate(refs)]
    monkeypatch.setenv("SACREBLEU_SEED", "12345")  # sacreBLEU's default: the committed study's
    pinned = PairedTest([("base", baseline), ("other", other)], {"BLEU": BLEU()}, [refs],
                        test_type="bs", n_samples=100)()[1]["BLEU"][1].p_value
    for seed in ("7", "none"):
        monkeypatch.setenv("SACREBLEU_SEED", seed)
        assert paired_bootstrap(baseline, {"other": other}, refs, 100)[0] == {"other": pinned}
        assert os.environ["SACREBLEU_SEED"] == seed  # the user's setting, as it was
    monkeypatch.delenv("SACREBLEU_SEED")
    assert paired_bootstrap(baseline, {"other": other}, refs, 100)[0] == {"other": pinned}
    assert "SACREBLEU_SEED" not in os.environ


def test_a_difference_the_same_on_every_seed_has_no_t_test_p_value():
    """Three seeds that differ from their baselines by the same BLEU gave p seeds 0.0 (the
    t-test of differences with no spread), a certainty three seeds cannot give."""
    from nmt.study_report import seed_test

    def cells(*bleus):
        return {seed: {"scores": {"bleu": bleu}} for seed, bleu in enumerate(bleus, 1)}

    base = cells(33.09, 33.37, 32.83)
    assert seed_test(cells(33.47, 33.75, 33.21), base, False) is None  # +0.38 each time
    assert seed_test(cells(32.09, 32.37, 31.83), base, False) is None  # -1.00 each time
    assert seed_test(cells(33.09, 33.37, 32.83), base, False) == 1.0  # no difference at all
    # +0.38, +0.38, +0.48: with 2 degrees of freedom, p = 1 - t / sqrt(2 + t^2)
    t = statistics.mean([0.38, 0.38, 0.48]) / (statistics.stdev([0.38, 0.38, 0.48]) / math.sqrt(3))
    assert seed_test(cells(33.47, 33.75, 33.31), base, False) == round(1 - t / math.sqrt(2 + t * t), 4)


@pytest.mark.parametrize("degrees, t, p", [
    (2, 4.303, 0.05), (2, 9.925, 0.01), (3, 3.182, 0.05), (4, 2.776, 0.05), (9, 2.262, 0.05),
    (9, 3.250, 0.01)])
def test_the_paired_t_test_gives_the_t_tables_two_sided_p(degrees, t, p):
    """At the t table's critical values (3 decimals), the two-sided p the table names; the
    differences are built to have that t statistic, either sign."""
    spread = [i - degrees / 2 for i in range(degrees + 1)]  # mean 0
    scale = statistics.stdev(spread) / math.sqrt(degrees + 1)
    differences = [x + t * scale for x in spread]  # mean t * sd / sqrt(n)
    for sign in (1, -1):
        a = [10 + sign * d for d in differences]
        assert paired_t_test(a, [10] * len(a)) == pytest.approx(p, abs=2e-4)


def test_the_paired_t_test_of_one_degree_of_freedom_is_its_closed_form():
    """Two seeds: p = 1 - 2 atan(|t|) / pi, the Cauchy distribution's."""
    a, b = [31.2, 30.1], [30.0, 29.8]
    d = [1.2, 0.3]
    t = statistics.mean(d) / (statistics.stdev(d) / math.sqrt(2))
    assert paired_t_test(a, b) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_compare_stopped_by_sigterm_ends_the_cell_it_trains(tmp_path, jobs):
    """SIGTERM to nmt compare (``kill``, ``timeout``) ended compare alone: the cell's training
    it had started trained on, unseen, holding its run's lock (with --jobs, its worker too)."""
    import signal
    import subprocess
    import sys
    import time

    files = write_corpus(tmp_path)
    common = [f"data.{split}_files=[{','.join(files[split])}]" for split in ("train", "val", "test")]
    config = {"families": {"rnn": str(REPO / "configs/rnn_bahdanau.yaml")},
              "baselines": {"rnn": "additive"}, "presets": {"p": {
                  "overrides": {"all": [*common, f"data.data_dir={tmp_path / 'data'}",
                                        "data.vocab_size=100", "trainer.max_epochs=1000",
                                        "trainer.early_stopping_patience=0",  # trains on
                                        "trainer.accelerator=cpu"], "rnn": TINY_RNN},
                  "groups": {"main": {"seeds": 2, "attentions": {"rnn": ["additive"]}}}}}}
    (tmp_path / "compare.yaml").write_text(yaml.safe_dump(config))
    runs = tmp_path / "runs"

    def trainings() -> set[int]:  # each holds its run's lock, naming itself
        locks = [lock.read_text() for lock in runs.glob("*/.lock")] if runs.is_dir() else []
        return {int(lock.split()[1]) for lock in locks if lock.startswith("pid ")}

    def alive(pid: int) -> bool:
        state = Path(f"/proc/{pid}/stat")
        return state.exists() and state.read_text().split(") ")[1][0] != "Z"

    compare = subprocess.Popen([sys.executable, "-m", "nmt", "compare", "--config",
                                str(tmp_path / "compare.yaml"), "--preset", "p", "--out",
                                str(tmp_path / "out"), "--runs", str(runs), "--jobs", jobs],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(1200):
            if trainings():
                break
            time.sleep(0.1)
        compare.send_signal(signal.SIGTERM)
        compare.wait(timeout=60)
        for _ in range(100):
            left = {pid for pid in trainings() if alive(pid)}
            if not left:
                break
            time.sleep(0.1)
    finally:
        compare.kill()
    for pid in left:
        os.kill(pid, 9)
    assert trainings() and not left, "the cell's training went on after compare was stopped"


def test_a_misspelt_baseline_is_a_one_line_error_before_anything_trains(tmp_path, capsys):
    """A baseline naming no scorer matched no cell: the family's cells trained, and its table
    left every p-value blank ("- / -") without a word on why."""
    config = {"families": {"rnn": str(REPO / "configs/rnn_bahdanau.yaml")},
              "baselines": {"rnn": "additve"},
              "presets": {"p": {"groups": {"main": {"attentions": {"rnn": ["additive", "dot"]}}}}}}
    (tmp_path / "compare.yaml").write_text(yaml.safe_dump(config))
    for only in (["--tables-only"], []):  # the first fails fast where the check is missing
        assert main(["compare", "--config", str(tmp_path / "compare.yaml"), "--preset", "p",
                     "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs"),
                     *only]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: baselines: rnn: unknown attention 'additve'; choose one of: ")
        assert len(err.splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_tables_only_with_cost_is_refused_before_anything_is_benched(monkeypatch, tmp_path, capsys):
    """--tables-only --cost ran the cost bench (20 minutes of the study's, which then replaced
    its cost.json) though --tables-only says: train nothing, rebuild the tables."""
    monkeypatch.setattr("nmt.compare.run_compare", lambda *args, **kwargs: pytest.fail("ran"))
    with pytest.raises(SystemExit) as ended:
        main(["compare", "--preset", "study", "--tables-only", "--cost", "--out", str(tmp_path)])
    assert ended.value.code == 2
    assert "argument --cost: not allowed with argument --tables-only" in capsys.readouterr().err
