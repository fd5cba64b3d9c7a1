"""Ensembles: the mean of the members' next-token probabilities, over any families, through the
same searches; and ``--ensemble`` on the command line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from nmt.cli import main
from nmt.models.ensemble import Ensemble
from nmt.search import beam_search, greedy_search

from .conftest import tiny_model, tiny_train_args, write_corpus


def _mixed():
    """An RNN and a Transformer over one vocabulary: states and attention of different shapes."""
    return Ensemble([tiny_model("rnn", "additive", vocab=30, seed=1).eval(),
                     tiny_model("transformer", "scaled_dot", vocab=30, seed=2).eval()])


def test_a_step_is_the_log_of_the_members_mean_probability(random_batch):
    ensemble, b = _mixed(), random_batch
    with torch.no_grad():
        memory = ensemble.encode(b.src, b.src_mask)
        state = ensemble.init_state(memory)
        for t in range(b.tgt_in.size(1)):
            members = [m.decode_step(b.tgt_in[:, t], s, mem)[0]
                       for m, s, mem in zip(ensemble.members, state, memory)]
            log_probs, state, attn = ensemble.decode_step(b.tgt_in[:, t], state, memory, True)
            mean = (members[0].exp() + members[1].exp()) / 2  # (B, V)
            torch.testing.assert_close(log_probs, mean.log(), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(b.src.size(0)))
            assert attn.shape == b.src.shape  # the first member's: the RNN's (B, S)


def test_incremental_decoding_equals_the_teacher_forced_forward(random_batch):
    ensemble, b = _mixed(), random_batch
    with torch.no_grad():
        full = ensemble(b.src, b.src_mask, b.tgt_in)  # (B, T, V) log-probabilities
        memory = ensemble.encode(b.src, b.src_mask)
        state = ensemble.init_state(memory)
        for t in range(b.tgt_in.size(1)):
            step, state, _ = ensemble.decode_step(b.tgt_in[:, t], state, memory)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_an_ensemble_of_one_model_or_of_two_copies_searches_as_the_model(family, random_batch):
    model, b = tiny_model(family, "dot", vocab=30, seed=3).eval(), random_batch
    alone = beam_search(model, b.src, b.src_mask, beam_size=3, alpha=0.6, nbest=2)
    for ensemble in (Ensemble([model]), Ensemble([model, model])):
        found = beam_search(ensemble, b.src, b.src_mask, beam_size=3, alpha=0.6, nbest=2)
        assert [[h.tokens for h in hyps] for hyps in found] == [[h.tokens for h in hyps] for hyps in alone]
        for hyps, expected in zip(found, alone):
            assert [h.score for h in hyps] == pytest.approx([h.score for h in expected], abs=1e-5)
        greedy = greedy_search(ensemble, b.src, b.src_mask)
        assert [h.tokens for h in greedy] == [h.tokens for h in greedy_search(model, b.src, b.src_mask)]


def test_a_mixed_ensemble_prunes_and_reorders_each_members_state(random_batch):
    """Beam search drops finished sentences and pruned beams from both members' states (a list
    of an RNN's tensor and a Transformer's cache) and finds what its log-probabilities say:
    each hypothesis' log-probability is the ensemble's teacher-forced one."""
    from nmt.data.tokenizer import BOS, EOS

    ensemble, b = _mixed(), random_batch
    results = beam_search(ensemble, b.src, b.src_mask, beam_size=4, alpha=0.6, prune_margin=1.0)
    for i, (best,) in enumerate(results):
        length = int(b.src_mask[i].sum())
        tgt = torch.tensor([[BOS] + best.tokens + [EOS]])
        with torch.no_grad():
            log_probs = ensemble(b.src[i:i + 1, :length], b.src_mask[i:i + 1, :length], tgt[:, :-1])[0]
        assert best.log_prob == pytest.approx(log_probs.gather(1, tgt[0, 1:, None]).sum().item(),
                                              abs=1e-4)
    assert ensemble.max_positions == min(m.max_positions for m in ensemble.members)
    assert math.isfinite(results[0][0].score)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs on one prepared corpus (one SentencePiece model), and one with another."""
    folder = tmp_path_factory.mktemp("ensemble")
    files = write_corpus(folder)
    for name, seed in (("a", "3"), ("b", "4")):
        assert main(tiny_train_args(files, folder / name, folder / "data") + ["--seed", seed]) == 0
    other = {split: [] for split in files}  # the same corpus with other letters: other pieces
    for split, paths in files.items():
        for path in map(Path, paths):
            changed = folder / f"other_{path.name}"
            changed.write_text(path.read_text(encoding="utf-8").replace("a", "ä"), encoding="utf-8")
            other[split].append(str(changed))
    assert main(tiny_train_args(other, folder / "other", folder / "data")) == 0
    return folder


def test_translate_and_evaluate_with_an_ensemble(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("haus mann\nkatze blau im park\n", encoding="utf-8")
    a, b = str(runs / "a"), str(runs / "b")

    assert main(["translate", "--checkpoint", a, "--input", "in.txt", "--beam", "3",
                 "--ensemble", b, "--nbest", "2"]) == 0
    both = capsys.readouterr().out
    assert len(both.splitlines()) == 4 and both.startswith("0 ||| ")

    assert main(["evaluate", "--checkpoint", a, "--ensemble", b, "--beam", "3"]) == 0
    written = [p for p in (runs / "a" / "eval").glob("test.beam3.ensemble2-*.json")]
    assert len(written) == 1
    scores = json.loads(written[0].read_text())
    assert scores["ensemble"] == [str((runs / "b" / "best.ckpt").resolve())]
    assert not (runs / "a" / "eval" / "test.beam3.json").exists()  # the run alone keeps its own


def test_a_members_missing_chosen_weights_are_named_once(runs, tmp_path, monkeypatch, capsys):
    """The members are checked before they load: the word on weights that are gone came twice."""
    monkeypatch.chdir(tmp_path)
    member = tmp_path / "b"
    shutil.copytree(runs / "b", member, ignore=shutil.ignore_patterns("eval"))
    (member / "train_stats.json").write_text(json.dumps({"final_weights": "averaged.ckpt"}))
    (tmp_path / "in.txt").write_text("haus mann\n", encoding="utf-8")
    assert main(["translate", "--checkpoint", str(runs / "a"), "--ensemble", str(member),
                 "--input", "in.txt"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"warning: {member / 'averaged.ckpt'}, the weights training chose, is gone") == 1


@pytest.mark.parametrize("options,message", [
    (["--ensemble", "{other}"], "their SentencePiece models differ, and an ensemble needs one"),
    (["--ensemble", "{a}/"], "--ensemble {a}/ is {a} again: a model beside itself translates"),
    (["--ensemble", "{b}", "{b}/."], "--ensemble {b}/. is {b} again: a model beside itself"),
    (["--ensemble", "{b}", "--plot-attention", "pics"], "--plot-attention draws one model's attention"),
    (["--ensemble", "{b}", "--engine", "ctranslate2"], "--ensemble is for the torch engine"),
    (["--ensemble", "{missing}"], "checkpoint directory not found"),
    (["--ensemble", "{enfr}"], "cannot ensemble"),
    (["--ensemble", "{b}", "--weights", "{a}/best.ckpt"], "with --ensemble names a file in each run"),
    (["--ensemble", "{export}"], "is a CTranslate2 export: --ensemble takes training runs"),
])
def test_runs_that_cannot_decode_as_one_are_refused_in_one_line(runs, tmp_path, monkeypatch, capsys,
                                                                 options, message):
    monkeypatch.chdir(tmp_path)
    enfr = tmp_path / "enfr"  # run b as if trained on another language pair
    shutil.copytree(runs / "b", enfr, ignore=shutil.ignore_patterns("eval"))
    config = (enfr / "config.yaml").read_text()
    (enfr / "config.yaml").write_text(config.replace("tgt_lang: en", "tgt_lang: fr"))
    export = tmp_path / "export"  # what nmt export writes, as far as a member's check looks
    shutil.copytree(runs / "b", export, ignore=shutil.ignore_patterns("*.ckpt", "eval"))
    (export / "model.bin").write_bytes(b"")
    paths = {"other": runs / "other", "a": runs / "a", "b": runs / "b", "missing": runs / "missing",
             "enfr": enfr, "export": export}
    (tmp_path / "in.txt").write_text("haus mann\n", encoding="utf-8")
    args = [option.format(**paths) for option in options]
    assert main(["translate", "--checkpoint", str(runs / "a"), "--input", "in.txt", *args]) == 1
    err = capsys.readouterr().err
    assert message.format(**paths) in err and err.count("\n") == 1
    assert not (tmp_path / "pics").exists()


def test_bench_decode_times_an_ensemble(runs, capsys, monkeypatch):
    """bench decode --ensemble decodes with the ensemble, as evaluate --ensemble does, and
    names the members' runs as it names the run (it named their checkpoint files, the run
    it was given by its directory)."""
    a, b = str(runs / "a"), str(runs / "b")
    fp32 = ["--precision", "32-true", "--beam", "2"]
    assert main(["evaluate", "--checkpoint", a, "--ensemble", b, *fp32]) == 0
    [written] = (runs / "a" / "eval").glob("test.beam2.ensemble2-*.json")  # 32-true: the run's own
    steps = []
    decode_step = Ensemble.decode_step
    monkeypatch.setattr(Ensemble, "decode_step",
                        lambda self, *args, **kwargs: steps.append(1) or decode_step(self, *args, **kwargs))
    capsys.readouterr()
    assert main(["bench", "decode", "--checkpoint", a, "--ensemble", b, *fp32, "--repeat", "1"]) == 0
    assert steps  # the ensemble decoded
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["run"] == a and summary["ensemble"] == [b]
    [beam2] = [row for row in summary["rows"] if row["mode"] == "beam2"]
    assert beam2["bleu"] == pytest.approx(json.loads(written.read_text())["bleu"], abs=0.01)
    assert main(["bench", "decode", "--checkpoint", a, "--ensemble", b,
                 "--engine", "torch,ctranslate2"]) == 1
    err = capsys.readouterr().err
    assert "--ensemble is for the torch engine" in err and err.count("\n") == 1
