"""sacreBLEU scores: corpus BLEU and chrF with their signatures, and BLEU from summed
sufficient statistics (so ranks of a distributed run can add theirs before scoring)."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF


def score_corpus(hypotheses: list[str], references: list[str]) -> dict:
    """Cased, detokenized BLEU and chrF of one system against one reference each."""
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
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
    return {"bleu_lc": round(bleu.corpus_score(hypotheses, [references]).score, 2),
            "bleu_lc_signature": str(bleu.get_signature())}


def bleu_statistics(hypotheses: list[str], references: list[str]) -> list[float]:
    """Sufficient statistics: [sys_len, ref_len, correct_1..4, total_1..4]."""
    stats = BLEU().corpus_score(hypotheses, [references])
    return [stats.sys_len, stats.ref_len, *stats.counts, *stats.totals]


def bleu_from_statistics(stats: list[float]) -> float:
    sys_len, ref_len = stats[0], stats[1]
    if sys_len == 0:
        return 0.0
    counts, totals = [int(x) for x in stats[2:6]], [int(x) for x in stats[6:10]]
    # BLEU() smooths with "exp" by default; compute_bleu must be told to do the same.
    return BLEU.compute_bleu(counts, totals, int(sys_len), int(ref_len), smooth_method="exp").score
