"""Scoring a split: its sentence pairs, and the file names that keep each decoding's results
apart (the decoding and scoring themselves run end to end in test_cli)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from nmt import evaluate
from nmt.config import DataConfig
from nmt.errors import NMTError
from nmt.evaluate import eval_file_stem, evaluation_pairs, margin_name, split_pairs

from .conftest import write_corpus


def test_split_pairs_reads_a_split_and_names_the_splits_there(tmp_path):
    files = write_corpus(tmp_path, sizes=(("train", 5), ("val", 2), ("test", 3)))
    data = DataConfig(train_files=files["train"], val_files=files["val"], test_files=files["test"],
                      data_dir=str(tmp_path))
    sources, references = split_pairs(data, "test")
    assert len(sources) == len(references) == 3
    assert references[0] == " ".join(reversed(sources[0].upper().split()))  # write_corpus's rule
    with pytest.raises(NMTError, match="split 'dev' not in the corpus; available: train, val, test"):
        split_pairs(data, "dev")


def test_files_named_for_the_reverse_direction_are_an_error(tmp_path):
    """evaluate --files test.en test.de of a de->en run translated the references and scored
    them against the source text: a BLEU near 0, and no word on why."""
    files = write_corpus(tmp_path, sizes=(("train", 5), ("val", 2), ("test", 3)))
    data = DataConfig(train_files=files["train"], val_files=files["val"], data_dir=str(tmp_path))
    for path, lang in zip(files["test"], ("de", "en")):
        (tmp_path / f"test.{lang}").write_bytes(Path(path).read_bytes())
    assert len(evaluation_pairs(data, "test", (str(tmp_path / "test.de"), str(tmp_path / "test.en")))[0]) == 3
    en, de = str(tmp_path / "test.en"), str(tmp_path / "test.de")
    with pytest.raises(NMTError, match=re.escape(  # the option as typed: [a, b] is no --files
            f"--files {en} {de} is [source, target], but their names say en->de, the reverse "
            f"of de->en: give --files {de} {en}")):
        evaluation_pairs(data, "test", (en, de))


def test_file_stem_names_each_option_given():
    assert eval_file_stem("test", 5) == "test.beam5"
    stem = eval_file_stem("val", 4, weights="steps/step30.ckpt", alpha=1.0, precision="bf16-mixed",
                          prune_margin=margin_name(None))
    assert stem == "val.beam4.step30.alpha1.bf16-mixed.prune-none"
    assert eval_file_stem("test", 2, prune_margin=margin_name(2.50)) == "test.beam2.prune-2.5"
    # a device as the record names it, without the colon
    assert eval_file_stem("test", 5, device="cuda:1") == "test.beam5.cuda1"
    assert eval_file_stem("test", 5, precision="32-true", device="cpu") == "test.beam5.32-true.cpu"


def test_weights_from_outside_the_run_never_share_the_runs_file_names():
    """evaluate --weights /elsewhere/averaged.ckpt overwrote RUN/eval/test.beam5.averaged.*,
    the run's own averaged weights' scores."""
    own = eval_file_stem("test", 5, weights="averaged.ckpt")
    other = eval_file_stem("test", 5, weights="/elsewhere/averaged.ckpt")
    third = eval_file_stem("test", 5, weights="/another/averaged.ckpt")
    assert own == "test.beam5.averaged" and len({own, other, third}) == 3
    assert other.startswith("test.beam5.averaged-")


def test_weights_in_a_folder_of_the_run_never_share_the_kept_checkpoints_file_names():
    """evaluate --weights old/step9.ckpt overwrote RUN/eval/test.beam5.step9.*, the scores of
    steps/step9.ckpt (and the other way round): both were named by the file's stem alone."""
    from nmt.average import STEPS_DIR

    kept = eval_file_stem("test", 5, weights=f"{STEPS_DIR}/step9.ckpt")  # where training keeps them
    assert kept == "test.beam5.step9"  # the run's own: by name, as a file directly in it
    others = {eval_file_stem("test", 5, weights=f"{folder}/step9.ckpt") for folder in ("old", "new")}
    assert len(others | {kept}) == 3 and all(o.startswith("test.beam5.step9-") for o in others)


def test_a_length_penalty_that_is_not_a_number_is_refused():
    """--alpha nan decoded, scored every hypothesis nan and wrote "alpha": NaN, not JSON."""
    from nmt.config import DecodingConfig
    from nmt.translator import decoding_options

    assert decoding_options(DecodingConfig(), 5, 1, 1.4) == (5, 1.4)
    with pytest.raises(NMTError, match="alpha must be a number, got nan"):
        decoding_options(DecodingConfig(), 5, 1, float("nan"))


def test_a_negative_length_penalty_is_refused():
    """--alpha -0.5 (or decoding.alpha) decoded: a penalty favouring short outputs beyond
    their log-probability, where the CTranslate2 engine's best could differ from ours."""
    from nmt.config import DecodingConfig
    from nmt.translator import decoding_options

    assert decoding_options(DecodingConfig(), 5, 1, 0.0) == (5, 0.0)
    with pytest.raises(NMTError, match=r"alpha must be from 0 \(none\) to 10, got -0.5"):
        decoding_options(DecodingConfig(), 5, 1, -0.5)
    with pytest.raises(NMTError, match="got -1.0"):
        decoding_options(DecodingConfig(alpha=-1.0), 5, 1, None)


def test_a_large_test_set_is_decoded_in_parts_each_said_on_stderr(monkeypatch, capsys):
    # 100,000 lines were decoded in one call: minutes without a word on stderr.
    calls = []

    class Upper:
        def translate(self, lines, beam, nbest, alpha, first_line=1):
            calls.append((len(lines), first_line))
            return [[SimpleNamespace(text=line.upper())] for line in lines]

    # raising=False: without parts, the calls below say what is wrong
    monkeypatch.setattr(evaluate, "PART_SENTENCES", 2, raising=False)
    assert evaluate.best_translations(Upper(), list("abcde")) == list("ABCDE")
    assert calls == [(2, 1), (2, 3), (1, 5)]  # first_line numbers the warnings about long lines
    assert capsys.readouterr().err.splitlines() == [
        "decoded 2 of 5 sentences", "decoded 4 of 5 sentences", "decoded 5 of 5 sentences"]
    calls.clear()
    assert evaluate.best_translations(Upper(), ["a", "b"]) == ["A", "B"]  # one part: no word
    assert calls == [(2, 1)] and capsys.readouterr().err == ""
