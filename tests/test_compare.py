"""``nmt compare`` end to end on a tiny matrix: files, reuse of finished cells, significance
from sacreBLEU; and the attention heatmap of known weights."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from nmt.cli import main
from nmt.plots import attention_matrix, draw_attention

from .conftest import REPO, write_corpus


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    files = write_corpus(folder)
    common = [f"data.{split}_files=[{','.join(files[split])}]" for split in ("train", "val", "test")]
    common += [f"data.data_dir={folder / 'data'}", "data.vocab_size=100", "data.max_tokens=600",
               "trainer.max_epochs=1", "trainer.accelerator=cpu"]
    config = {
        "name": "tiny",
        "families": {"rnn": str(REPO / "configs/rnn_bahdanau.yaml"),
                     "transformer": str(REPO / "configs/transformer.yaml")},
        "attentions": ["additive", "scaled_dot"],
        "beam": 3, "bootstrap_samples": 200, "plot_sentences": [0, 1],
        "presets": {"tiny": {
            "all": common,
            "rnn": ["model.emb_dim=16", "model.hidden_size=32", "model.attention_dim=32"],
            "transformer": ["model.d_model=32", "model.heads=2", "model.ff_dim=64",
                            "model.encoder_layers=1", "model.decoder_layers=1"],
        }},
    }
    path = folder / "compare.yaml"
    path.write_text(yaml.safe_dump(config))
    out = folder / "results"
    argv = ["compare", "--config", str(path), "--preset", "tiny", "--out", str(out)]
    assert main(argv) == 0
    return argv, out, files


def test_compare_writes_every_output(study):
    _, out, _ = study
    for name in ("compare.md", "compare.json", "compare.csv", "bleu.png", "cost.png",
                 "attention/test_0001.png", "attention/test_0002.png"):
        assert (out / name).is_file(), name
    rows = json.loads((out / "compare.json").read_text())
    assert [(r["family"], r["attention"]) for r in rows] == [
        ("rnn", "additive"), ("rnn", "scaled_dot"),
        ("transformer", "additive"), ("transformer", "scaled_dot")]
    for row in rows:
        assert 0 <= row["bleu"] <= 100 and row["parameters"] > 0 and row["train_tok_per_s"] > 0
        assert row["decode_sent_per_s"] > 0 and row["peak_rss_mb"] > 0
        assert row["signature"].startswith("nrefs:1") and "lc" in row["signature_lc"]
        is_baseline = row["attention"] == {"rnn": "additive", "transformer": "scaled_dot"}[row["family"]]
        assert (row["p_vs_baseline"] is None) == is_baseline
        if not is_baseline:
            assert 0 < row["p_vs_baseline"] <= 1
    table = (out / "compare.md").read_text()
    assert "| rnn | scaled_dot |" in table and "baseline" in table


def test_p_values_are_sacrebleus_paired_bootstrap(study):
    _, out, _ = study
    rows = {(r["family"], r["attention"]): r for r in json.loads((out / "compare.json").read_text())}
    runs = out / "runs"
    hyps = {name: json.loads((runs / name / "compare_decode.beam3.json").read_text())["hypotheses"]
            for name in ("rnn_additive_seed1", "rnn_scaled_dot_seed1")}
    refs = [line.rstrip("\n") for line in open(study[2]["test"][1], encoding="utf-8")]
    test = PairedTest([("base", hyps["rnn_additive_seed1"]), ("dot", hyps["rnn_scaled_dot_seed1"])],
                      {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=200)
    _, results = test()
    assert rows[("rnn", "scaled_dot")]["p_vs_baseline"] == round(results["BLEU"][1].p_value, 4)


def test_finished_cells_are_reused_and_missing_ones_trained(study, capsys):
    argv, out, _ = study
    removed = out / "runs" / "transformer_additive_seed1"
    kept = out / "runs" / "rnn_additive_seed1" / "train_stats.json"
    stamp = kept.stat().st_mtime_ns
    for path in sorted(removed.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    removed.rmdir()
    capsys.readouterr()
    assert main(argv) == 0
    log = capsys.readouterr().out
    assert log.count("trained already, reused") == 3
    assert "transformer_additive_seed1: training" in log
    assert kept.stat().st_mtime_ns == stamp
    assert (removed / "train_stats.json").is_file()


def test_unknown_preset_is_an_error(study, capsys):
    argv, _, _ = study
    assert main([*argv[:-3], "nope", *argv[-2:]]) == 1
    assert "unknown preset 'nope'; choose one of: tiny" in capsys.readouterr().err


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
