"""Output formats of the translator."""

from __future__ import annotations

import pytest

from nmt.translator import Translation, moses_nbest


def test_moses_nbest_has_four_fields_and_score_is_logprob_over_lp():
    results = [[Translation("a dog .", -0.5, ["▁a", "▁dog", "▁."], log_prob=-1.0, length_penalty=2.0),
                Translation("dog", -0.75, ["▁dog"], log_prob=-1.2, length_penalty=1.6)],
               [Translation("", 0.0, [], log_prob=0.0)]]
    rows = moses_nbest(results)
    assert rows == ["0 ||| a dog . ||| logprob= -1.0000 lp= 2.0000 ||| -0.5000",
                    "0 ||| dog ||| logprob= -1.2000 lp= 1.6000 ||| -0.7500",
                    "1 |||  ||| logprob= 0.0000 lp= 1.0000 ||| 0.0000"]
    for row in rows:
        number, text, features, score = row.split(" ||| ")
        values = features.split()
        logprob, lp = float(values[1]), float(values[3])
        assert values[0::2] == ["logprob=", "lp="]
        assert float(score) == pytest.approx(logprob / lp, abs=1e-4)
