"""Output formats of the translator, and the device it decodes on."""

from __future__ import annotations

import pytest
import torch

from nmt.errors import NMTError
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


def test_an_nbest_text_holding_the_separator_is_written_as_is_and_read_back():
    """As Moses' decoder and Marian: no escaping; docs/usage.md's reading (id before the first
    separator, features and score after the last two) gives the text back whole."""
    text = "a ||| b |||"
    [row] = moses_nbest([[Translation(text, -0.5, ["▁a"], log_prob=-1.0, length_penalty=2.0)]], 7)
    number, rest = row.split(" ||| ", 1)
    read, features, score = rest.rsplit(" ||| ", 2)
    assert (number, read, features, score) == ("7", text, "logprob= -1.0000 lp= 2.0000", "-0.5000")


def test_decoding_device_is_checked_against_the_machine(monkeypatch):
    """A two-GPU machine, played: the index is kept (serve's workers each take their own GPU)
    and checked; other device kinds are refused."""
    from nmt.engines import decoding_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert decoding_device(None) == "cuda"
    given = ("cpu", "cpu:0", "cuda", "cuda:1")  # cpu:0 is the one CPU device torch.load knows
    assert [decoding_device(d) for d in given] == ["cpu", "cpu", "cuda", "cuda:1"]
    for device, message in (("cuda:2", r"there are 2 CUDA device\(s\)"), ("mps", "unknown device 'mps'"),
                            ("gpu0", "unknown device 'gpu0'")):
        with pytest.raises(NMTError, match=message):
            decoding_device(device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert decoding_device(None) == "cpu"
    with pytest.raises(NMTError, match="no CUDA device is available"):
        decoding_device("cuda:0")


def test_a_run_with_no_checkpoint_yet_is_not_called_something_else(tmp_path):
    """A run still training before its first validation (its config written, no weights yet):
    serve, translate and evaluate asked "is it a training run directory?" of what is one."""
    from nmt.translator import find_checkpoint

    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(NMTError) as refused:
        find_checkpoint(tmp_path)
    assert str(refused.value) == (f"no best.ckpt or last.ckpt in {tmp_path} yet: a run saves them "
                                  "from its first validation on, which one still training may "
                                  "not have reached")
