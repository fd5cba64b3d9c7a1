"""sacreBLEU's scores, taken a part of the corpus at a time: the same numbers and signatures
as its own ``corpus_score``, with at most a part's references cached at once."""

from __future__ import annotations

import random

import pytest
from sacrebleu.metrics import BLEU, CHRF

import nmt.metrics
from nmt.metrics import bleu_statistics, lowercase_bleu, score_corpus

WORDS = "a dog Dog runs across the green field two cats sleep on red sofa . , man woman".split()


def sentences(count: int, seed: int) -> list[str]:
    draw = random.Random(seed)
    return [" ".join(draw.choices(WORDS, k=draw.randint(1, 12))) for _ in range(count)]


@pytest.fixture
def corpus(monkeypatch):
    """10 lines scored 3 at a time: parts of 3, 3, 3 and 1 line; references cached per part."""
    monkeypatch.setattr(nmt.metrics, "SCORED_AT_ONCE", 3)
    cached: list[int] = []
    for metric in (BLEU, CHRF):
        own = metric._cache_references
        monkeypatch.setattr(metric, "_cache_references", lambda self, refs, own=own:
                            cached.append(len(refs[0])) or own(self, refs))
    return sentences(10, 1), sentences(10, 2), cached


def test_scores_in_parts_are_sacrebleus_own(corpus):
    hyps, refs, cached = corpus
    bleu, chrf = BLEU(), CHRF()
    bleu_score, chrf_score = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    cached.clear()  # sacreBLEU's own calls: the whole corpus at once
    assert score_corpus(hyps, refs) == {
        "bleu": round(bleu_score.score, 2), "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
        "bleu_verbose": str(bleu_score), "sentences": 10}
    assert cached == [3, 3, 3, 1] * 2  # BLEU's parts, then chrF's
    assert 0 < bleu_score.score < 100 and 0 < chrf_score.score < 100  # a score with matches to sum


def test_lowercased_bleu_and_validations_statistics_in_parts_are_sacrebleus(corpus):
    hyps, refs, cached = corpus
    lowercased = BLEU(lowercase=True)
    assert lowercase_bleu(hyps, refs) == {
        "bleu_lc": round(lowercased.corpus_score(hyps, [refs]).score, 2),
        "bleu_lc_signature": str(lowercased.get_signature())}
    whole = BLEU().corpus_score(hyps, [refs])
    assert bleu_statistics(hyps, refs) == [whole.sys_len, whole.ref_len, *whole.counts, *whole.totals]
    assert max(cached) == 10 and cached.count(3) == 6  # sacreBLEU's whole, ours in parts


def test_the_warning_of_tokenized_input_is_said_once_not_once_a_part(monkeypatch, caplog):
    """BLEU warns where 100 lines end in " ." (tokenized text); parts of 100 said it in each."""
    monkeypatch.setattr(nmt.metrics, "SCORED_AT_ONCE", 100)
    hyps = [line + " ." for line in sentences(250, 3)]  # parts of 100, 100, 50: two warn
    with caplog.at_level("WARNING", logger="sacrebleu"):
        score_corpus(hyps, sentences(250, 4))
    said = [record.getMessage() for record in caplog.records]
    assert said[0] == "That's 100 lines that end in a tokenized period ('.')"
    assert len(said) == len(set(said)) == 3  # sacreBLEU's three lines, once
    with caplog.at_level("WARNING", logger="sacrebleu"):
        score_corpus(hyps, sentences(250, 4))
    assert len(caplog.records) == 6  # said again by the next score: once each time


def test_hypotheses_and_references_of_different_counts_are_refused():
    """sacreBLEU scores the shorter list's length without a word, and a part with no
    references changed the signature (nrefs:var)."""
    with pytest.raises(ValueError, match="3 hypotheses against 2 references"):
        score_corpus(["a", "b", "c"], ["a", "b"])
