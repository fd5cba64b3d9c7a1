"""Decoding properties of both families: beam 1 = greedy, batched = one by one,
incremental = full recompute, padding never changes a sentence's output."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.data.batching import collate
from nmt.data.tokenizer import BOS, EOS
from nmt.search import beam_search, greedy_search, length_penalty

from .conftest import tiny_model

CASES = [(family, attention) for family in ("rnn", "transformer")
         for attention in ("additive", "dot", "general", "scaled_dot")]


def _model(family, attention, **options):
    return tiny_model(family, attention, vocab=30, seed=3, **options).eval()


@pytest.mark.parametrize("family,options", [("rnn", {"rnn_type": "lstm", "encoder_layers": 2}),
                                            ("transformer", {"pre_norm": False})])
def test_variants_decode_incrementally(family, options, random_batch):
    _assert_incremental_equals_full(_model(family, "general", **options), random_batch)


@pytest.mark.parametrize("family,attention", CASES)
def test_incremental_decoding_equals_full_forward(family, attention, random_batch):
    _assert_incremental_equals_full(_model(family, attention), random_batch)


def _assert_incremental_equals_full(model, b):
    with torch.no_grad():
        full = model(b.src, b.src_mask, b.tgt_in).log_softmax(-1)  # (B, T, V)
        memory = model.encode(b.src, b.src_mask)
        state = model.init_state(memory)
        for t in range(b.tgt_in.size(1)):
            step, state, _ = model.decode_step(b.tgt_in[:, t], state, memory)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family,attention", CASES)
def test_beam_one_equals_greedy(family, attention, random_batch):
    model = _model(family, attention)
    b = random_batch
    greedy = greedy_search(model, b.src, b.src_mask)
    beam = beam_search(model, b.src, b.src_mask, beam_size=1, alpha=0.0)
    assert [h.tokens for h in greedy] == [hyps[0].tokens for hyps in beam]
    for g, hyps in zip(greedy, beam):
        assert hyps[0].score == pytest.approx(g.score, abs=1e-4)


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_batched_beam_equals_one_by_one_and_padding_is_invisible(family, random_batch):
    model = _model(family, "additive")
    b = random_batch
    together = beam_search(model, b.src, b.src_mask, beam_size=4, nbest=4)
    for i in range(b.src.size(0)):
        length = int(b.src_mask[i].sum())
        alone = beam_search(model, b.src[i : i + 1, :length], b.src_mask[i : i + 1, :length],
                            beam_size=4, nbest=4)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        for x, y in zip(alone, together[i]):
            assert x.score == pytest.approx(y.score, abs=1e-4)


def test_nbest_sorted_distinct_and_length_penalty_applied(random_batch):
    model = _model("transformer", "scaled_dot")
    b = random_batch
    results = beam_search(model, b.src, b.src_mask, beam_size=5, nbest=5, alpha=1.0)
    for hyps in results:
        assert len(hyps) == 5
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 5
    assert length_penalty(5, 1.0) == pytest.approx(10 / 6)
    assert length_penalty(7, 0.0) == 1.0


def test_output_length_is_bounded_by_ratio():
    model = _model("rnn", "dot")  # untrained: rarely ends by itself
    b = collate([(0, [5, 6, 7], [5]), (1, [5] * 10, [5])])
    for hyps in beam_search(model, b.src, b.src_mask, beam_size=3, max_len_ratio=1.0):
        assert len(hyps[0].tokens) < 4 + 5 + 11  # ratio x (len + EOS) + 5, EOS excluded
    greedy = greedy_search(model, b.src, b.src_mask, max_len_ratio=1.0)
    assert len(greedy[0].tokens) <= 4 + 5 - 1


def test_beam_attention_rows_match_tokens(random_batch):
    model = _model("rnn", "additive")
    b = random_batch
    for i, hyps in enumerate(beam_search(model, b.src, b.src_mask, beam_size=3, need_attn=True)):
        hyp = hyps[0]
        assert hyp.attention.shape == (len(hyp.tokens) + 1, b.src.size(1))
        torch.testing.assert_close(hyp.attention.sum(-1), torch.ones(len(hyp.tokens) + 1))
        assert torch.all(hyp.attention[:, ~b.src_mask[i]] == 0)


class ScriptedModel(torch.nn.Module):
    """A stand-in model whose next-token distribution depends only on the previous token.

    After BOS: EOS 0.3, token 5 0.6, token 4 0.1. After any other token: token 5 almost
    surely, EOS 1e-4, so a hypothesis that starts with a word runs into the length limit.
    """

    max_positions = 64
    AFTER_BOS = {EOS: 0.3, 5: 0.6, 4: 0.1}
    LATER = {EOS: 1e-4, 5: 1 - 1e-4}

    def encode(self, src, src_mask):
        return {"mask": src_mask}

    def init_state(self, memory):
        return None

    def decode_step(self, prev, state, memory, need_attn=False):
        probs = torch.zeros(prev.size(0), 6)
        for row, token in enumerate(prev.tolist()):
            for word, p in (self.AFTER_BOS if token == BOS else self.LATER).items():
                probs[row, word] = p
        return probs.log(), state, None


def test_a_hypothesis_cut_at_the_length_limit_pays_for_its_eos():
    """Source of 1 piece + EOS, ratio 1: at most 7 output pieces (6 words + a forced EOS).
    The forced EOS costs the model's log(1e-4), so the empty hypothesis (EOS first, log 0.3)
    wins; scoring the forced EOS 0 would have made '5 5 5 5 5 5' win with log 0.6."""
    model, b = ScriptedModel(), collate([(0, [7], [7])])
    cut = math.log(0.6) + 5 * math.log(1 - 1e-4) + math.log(1e-4)
    greedy = greedy_search(model, b.src, b.src_mask, max_len_ratio=1.0)[0]
    assert greedy.tokens == [5] * 6 and greedy.log_prob == pytest.approx(cut)
    hyps = beam_search(model, b.src, b.src_mask, beam_size=2, alpha=0.0, max_len_ratio=1.0,
                       nbest=2)[0]
    assert [h.tokens for h in hyps] == [[], [5] * 6]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.3), cut])


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_hypothesis_log_prob_is_the_models_and_score_divides_it_by_the_penalty(family,
                                                                               random_batch):
    """What the n-best features report: log_prob equals the teacher-forced log-probability
    of tokens + EOS, and score = log_prob / lp(len + 1)."""
    model, b = _model(family, "dot"), random_batch
    results = beam_search(model, b.src, b.src_mask, beam_size=3, nbest=3, alpha=0.6,
                          max_len_ratio=1.0)
    for i, hyps in enumerate(results):
        length = int(b.src_mask[i].sum())
        src, mask = b.src[i : i + 1, :length], b.src_mask[i : i + 1, :length]
        for h in hyps:
            tgt = torch.tensor([[BOS] + h.tokens + [EOS]])
            with torch.no_grad():
                log_probs = model(src, mask, tgt[:, :-1]).log_softmax(-1)[0]  # (T, V)
            expected = log_probs.gather(1, tgt[0, 1:].unsqueeze(1)).sum().item()
            assert h.log_prob == pytest.approx(expected, abs=1e-4)
            assert h.penalty == pytest.approx(length_penalty(len(h.tokens) + 1, 0.6))
            assert h.score == pytest.approx(h.log_prob / h.penalty)
