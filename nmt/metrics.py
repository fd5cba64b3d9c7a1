"""sacreBLEU scores: corpus BLEU and chrF with their signatures, and BLEU from summed
sufficient statistics (so ranks of a distributed run can add theirs before scoring)."""

from __future__ import annotations

import logging

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Score
from sacrebleu.utils import sacrelogger

SCORED_AT_ONCE = 10_000  # lines whose references' n-grams sacreBLEU holds at a time


def corpus_score(metric: BLEU | CHRF, hypotheses: list[str], references: list[str]) -> Score:
    """``metric.corpus_score(hypotheses, [references])``, ``SCORED_AT_ONCE`` lines at a time.
    sacreBLEU first caches the n-grams of every reference, then scores: chrF's take ~21 KB a
    line (20,000 Multi30k lines: 428 MB; a million-line split, some 20 GB). A corpus score
    is computed from the sum of its lines' statistics, so it is the same when the two steps
    ``corpus_score`` runs are taken a part at a time (as sacreBLEU's significance tests call
    them). BLEU's warning of tokenized input, said where 100 lines of a part end in " ." (of
    the whole corpus, before), is said once, not once a part."""
    if len(hypotheses) != len(references):  # sacreBLEU would score the shorter's length
        raise ValueError(f"{len(hypotheses)} hypotheses against {len(references)} references")
    metric._check_corpus_score_args(hypotheses, [references])
    statistics = []  # one list per line: sacreBLEU's input to the score
    said_once = OnceEach()
    sacrelogger.addFilter(said_once)
    try:
        for start in range(0, len(hypotheses), SCORED_AT_ONCE):
            part = slice(start, start + SCORED_AT_ONCE)
            statistics += metric._extract_corpus_statistics(hypotheses[part], [references[part]])
    finally:
        sacrelogger.removeFilter(said_once)
    return metric._aggregate_and_compute(statistics)


class OnceEach(logging.Filter):
    """Lets each message through once."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


def score_corpus(hypotheses: list[str], references: list[str]) -> dict:
    """Cased, detokenized BLEU and chrF of one system against one reference each."""
    bleu, chrf = BLEU(), CHRF()
    bleu_score = corpus_score(bleu, hypotheses, references)
    chrf_score = corpus_score(chrf, hypotheses, references)
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_verbose": str(bleu_score),
        "sentences": len(hypotheses),
    }


def lowercase_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU of the lower-cased texts, with its own signature (``case:lc``): beside the cased
    score's, a lower-cased score without it reads as cased."""
    bleu = BLEU(lowercase=True)
    return {"bleu_lc": round(corpus_score(bleu, hypotheses, references).score, 2),
            "bleu_lc_signature": str(bleu.get_signature())}


def bleu_statistics(hypotheses: list[str], references: list[str]) -> list[float]:
    """Sufficient statistics: [sys_len, ref_len, correct_1..4, total_1..4]."""
    stats = corpus_score(BLEU(), hypotheses, references)
    return [stats.sys_len, stats.ref_len, *stats.counts, *stats.totals]


def bleu_from_statistics(stats: list[float]) -> float:
    sys_len, ref_len = stats[0], stats[1]
    if sys_len == 0:
        return 0.0
    counts, totals = [int(x) for x in stats[2:6]], [int(x) for x in stats[6:10]]
    # BLEU() smooths with "exp" by default; compute_bleu must be told to do the same.
    return BLEU.compute_bleu(counts, totals, int(sys_len), int(ref_len), smooth_method="exp").score
