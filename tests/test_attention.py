"""Scorer properties: masked keys get zero weight, shapes, fused path = explicit path."""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from nmt.attention import SCORERS, MultiHeadAttention, ScaledDotScorer, Scorer, build_scorer
from nmt.errors import NMTError


@pytest.mark.parametrize("name", list(SCORERS))
def test_masked_keys_get_zero_weight_and_rows_sum_to_one(name):
    torch.manual_seed(0)
    scorer = build_scorer(name, 8, 8, 8)
    query, keys = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]]).unsqueeze(1)
    context, weights = scorer.attend(query, scorer.prepare_keys(keys), keys, mask)
    assert weights.shape == (2, 3, 5) and context.shape == (2, 3, 8)
    assert torch.all(weights[1, :, 2:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3))
    # Changing what sits under the mask changes nothing.
    keys2 = keys.clone()
    keys2[1, 2:] = 100.0
    context2, _ = scorer.attend(query, scorer.prepare_keys(keys2), keys2, mask)
    torch.testing.assert_close(context2[1], context[1])


@pytest.mark.parametrize("name", list(SCORERS))
def test_a_query_that_may_attend_to_nothing_gets_zeros_not_nan(name):
    """A (B, T, S) mask hiding every key from a query (a padded query's row) gave NaN
    weights and context on the explicit path, NaN gradients with them, where the fused
    kernel gives zeros: now zeros on both, the other rows as before, gradients finite."""
    torch.manual_seed(0)
    scorer = build_scorer(name, 8, 8, 8)
    query, keys = torch.randn(2, 3, 8, requires_grad=True), torch.randn(2, 5, 8)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 2] = False  # sentence 1's last query: every key hidden
    context, weights = scorer.attend(query, scorer.prepare_keys(keys), keys, mask)
    assert torch.all(weights[1, 2] == 0) and torch.all(context[1, 2] == 0)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(3))
    context.sum().backward()
    assert torch.isfinite(query.grad).all()


@pytest.mark.parametrize("name", ["scaled_dot", "symmetric"])
def test_a_query_that_may_attend_to_nothing_gets_the_fused_kernels_answer(monkeypatch, name):
    monkeypatch.setattr(ScaledDotScorer, "FUSED_CPU_MIN_SCORES", 0)  # fused at every size
    torch.manual_seed(0)
    scorer = build_scorer(name, 16, 16, 16)
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    mask = torch.ones(2, 1, 3, 7, dtype=torch.bool)
    mask[0, :, 1] = False
    fused, _ = scorer.attend(q, k, v, mask, need_weights=False)
    explicit, _ = scorer.attend(q, k, v, mask, need_weights=True)
    torch.testing.assert_close(fused, explicit)


def test_additive_is_bahdanau_formula():
    torch.manual_seed(0)
    scorer = build_scorer("additive", 4, 6, 5)
    q, k = torch.randn(1, 1, 4), torch.randn(1, 3, 6)
    expected = torch.stack([
        scorer.v.weight @ torch.tanh(scorer.query_proj.weight @ q[0, 0] + scorer.key_proj.weight @ kj)
        for kj in k[0]
    ]).view(1, 1, 3)
    torch.testing.assert_close(scorer.score(q, scorer.prepare_keys(k)), expected)


def test_additive_deep_has_one_more_hidden_layer():
    torch.manual_seed(0)
    scorer = build_scorer("additive_deep", 4, 6, 5)
    q, k = torch.randn(1, 1, 4), torch.randn(1, 3, 6)
    w, u, w2, v = (scorer.query_proj.weight, scorer.key_proj.weight, scorer.hidden.weight,
                   scorer.v.weight)
    expected = torch.stack([v @ torch.tanh(w2 @ torch.tanh(w @ q[0, 0] + u @ kj))
                            for kj in k[0]]).view(1, 1, 3)
    torch.testing.assert_close(scorer.score(q, scorer.prepare_keys(k)), expected)


@pytest.mark.parametrize("need_weights", [True, False])
def test_symmetric_projects_and_scales_the_attended_values(monkeypatch, need_weights):
    """softmax(Q K^T / sqrt(d)) V W^T / sqrt(d), on the fused and the explicit path (the
    fused kernel taken at every size, as on CUDA)."""
    monkeypatch.setattr(ScaledDotScorer, "FUSED_CPU_MIN_SCORES", 0)
    torch.manual_seed(0)
    symmetric, scaled = build_scorer("symmetric", 16, 16, 16), build_scorer("scaled_dot", 16, 16, 16)
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    plain, _ = scaled.attend(q, k, v, mask, need_weights=True)
    context, weights = symmetric.attend(q, k, v, mask, need_weights=need_weights)
    assert (weights is None) != need_weights  # the path asked for was taken
    torch.testing.assert_close(context, plain @ symmetric.value_proj.weight.T / 4.0)


@pytest.mark.parametrize("fused_from", [0, ScaledDotScorer.FUSED_CPU_MIN_SCORES])
def test_scaled_dot_fused_equals_explicit(monkeypatch, fused_from):
    """The fused kernel (taken from ``fused_from`` scores on CPU) equals the explicit path."""
    monkeypatch.setattr(ScaledDotScorer, "FUSED_CPU_MIN_SCORES", fused_from)
    torch.manual_seed(0)
    scorer = build_scorer("scaled_dot", 16, 16, 16)
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    mask = torch.rand(2, 1, 1, 7) > 0.3
    mask[..., 0] = True
    fused, none = scorer.attend(q, k, v, mask, need_weights=False)
    explicit, weights = scorer.attend(q, k, v, mask, need_weights=True)
    assert weights is not None and (none is None) == (fused_from == 0)
    torch.testing.assert_close(fused, explicit)


@pytest.mark.parametrize("name", list(SCORERS))
def test_a_scorers_flop_count_covers_the_matmuls_it_runs(name):
    """``flops`` (prepare_keys, score, the weighted sum) against torch's count of the matmuls
    really run: at least those, and at most a few more per (T, S, A) element (the additive
    scorers' broadcast sum and squashing, which torch does not count). The RNN counts the
    key-side part once per sentence: score_flops(0, S) is prepare_keys' count alone."""
    t, s, d, a = 3, 5, 8, 6
    scorer = build_scorer(name, d, d, a)
    query, keys = torch.randn(1, t, d), torch.randn(1, s, d)
    with FlopCounterMode(display=False) as counter:
        scorer.attend(query, scorer.prepare_keys(keys), keys, None)
    assert counter.get_total_flops() <= scorer.flops(t, s) <= counter.get_total_flops() + 3 * t * s * a
    with FlopCounterMode(display=False) as counter:
        scorer.prepare_keys(keys)
    assert scorer.score_flops(0, s) == counter.get_total_flops()


def test_a_scorer_without_its_flop_count_cannot_be_built():
    """Every FLOP count (bench train, compare --cost) asks the scorer: found when it is built,
    not as an AttributeError in the middle of a benchmark."""
    class Bilinear(Scorer):
        def score(self, query, keys):
            return query @ keys.transpose(-1, -2)

    with pytest.raises(TypeError, match="score_flops"):
        Bilinear(4, 4, 4)


def test_unknown_scorer_lists_valid_names():
    with pytest.raises(NMTError, match=re.escape(f"choose one of: {', '.join(SCORERS)}")):
        build_scorer("cosine", 4, 4, 4)


def test_dot_needs_equal_dims():
    with pytest.raises(NMTError, match="query_dim == key_dim"):
        build_scorer("dot", 4, 6, 4)


@pytest.mark.parametrize("name", list(SCORERS))
def test_multi_head_weights_shape(name):
    mha = MultiHeadAttention(name, 16, 4, 0.0)
    x, mem = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    out, weights = mha(x, mha.project_keys(mem), torch.ones(2, 1, 5, dtype=torch.bool), True)
    assert out.shape == (2, 3, 16) and weights.shape == (2, 4, 3, 5)
