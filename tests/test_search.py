"""Decoding properties of both families: beam 1 = greedy, batched = one by one,
incremental = full recompute, padding never changes a sentence's output."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from nmt.attention import SCORERS
from nmt.bench import count_rows
from nmt.data.batching import collate
from nmt.data.tokenizer import BOS, EOS
from nmt.models.base import Beams, select_rows
from nmt.search import (
    Hypothesis,
    beam_search,
    greedy_search,
    length_penalty,
    max_output_lengths,
    restrict,
    top_k,
)

from .conftest import reversal_batch, tiny_model

CASES = [(family, attention) for family in ("rnn", "transformer") for attention in SCORERS]


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
def test_batched_greedy_equals_one_by_one(family, random_batch):
    """Sentences leave the greedy batch as they end: the others must keep their own rows of
    state and memory, so each output equals the sentence decoded alone."""
    model = _model(family, "general")
    b = random_batch
    together = greedy_search(model, b.src, b.src_mask)
    lengths = {len(h.tokens) for h in together}
    assert len(lengths) > 1  # sentences end at different steps: rows were dropped
    for i in range(b.src.size(0)):
        length = int(b.src_mask[i].sum())
        alone = greedy_search(model, b.src[i : i + 1, :length], b.src_mask[i : i + 1, :length])[0]
        assert alone.tokens == together[i].tokens
        assert alone.log_prob == pytest.approx(together[i].log_prob, abs=1e-4)


@pytest.mark.parametrize("family", ["rnn", "transformer"])
@pytest.mark.parametrize("nbest,margin", [(4, None), (1, 0.05)])
def test_batched_beam_equals_one_by_one_and_padding_is_invisible(family, nbest, margin,
                                                                 random_batch):
    """Also with pruning (margin): sentences then keep different numbers of beams, and each
    beam must still attend over its own sentence."""
    model = _model(family, "additive")
    b = random_batch
    rows = count_rows(model)
    together = beam_search(model, b.src, b.src_mask, beam_size=4, nbest=nbest, prune_margin=margin)
    if margin is not None:  # hypotheses were pruned: fewer rows than unpruned beams
        pruned, rows[0] = rows[0], 0
        beam_search(model, b.src, b.src_mask, beam_size=4, nbest=nbest)
        assert pruned < rows[0]
    for i in range(b.src.size(0)):
        length = int(b.src_mask[i].sum())
        alone = beam_search(model, b.src[i : i + 1, :length], b.src_mask[i : i + 1, :length],
                            beam_size=4, nbest=nbest, prune_margin=margin)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        for x, y in zip(alone, together[i]):
            assert x.score == pytest.approx(y.score, abs=1e-4)


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_a_step_over_some_beam_slots_equals_those_rows_of_a_full_step(family, random_batch):
    """After pruning the batch holds only some of the n * K beam slots (``Beams``): their
    log-probabilities and attention equal those rows of a step over every slot."""
    model, b, k = _model(family, "additive"), random_batch, 3
    n = b.src.size(0)
    with torch.no_grad():
        memory = model.encode(b.src, b.src_mask)
        _, state, _ = model.decode_step(torch.full((n,), BOS), model.init_state(memory), memory)
        state = select_rows(state, torch.arange(n).repeat_interleave(k))  # K beams each
        prev = torch.randint(4, 30, (n * k,), generator=torch.Generator().manual_seed(0))
        full, _, full_attn = model.decode_step(prev, state, memory, True)
        slots = torch.tensor([0, 2, 3, 4, 5, 7])  # sentence 0: beams 0, 2; 1: all; 2: beam 1
        some, _, some_attn = model.decode_step(prev[slots], select_rows(state, slots), memory,
                                               True, Beams(k, slots))
    torch.testing.assert_close(some, full[slots], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(some_attn, full_attn[slots], atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_output_length_is_bounded_by_ratio(family):
    """Each sentence's own limit, ratio x (its length + EOS) + 5 with EOS: 9 and 16 here."""
    model = _model(family, "dot")  # untrained: rarely ends by itself
    b = collate([(0, [5, 6, 7], [5]), (1, [5] * 10, [5])])
    limits = [(3 + 1) + 5, (10 + 1) + 5]
    assert max_output_lengths(b.src_mask, 1.0, model.max_positions).tolist() == limits
    for hyps, limit in zip(beam_search(model, b.src, b.src_mask, beam_size=3, max_len_ratio=1.0), limits):
        assert len(hyps[0].tokens) <= limit - 1  # EOS excluded
    greedy = greedy_search(model, b.src, b.src_mask, max_len_ratio=1.0)
    assert [len(h.tokens) for h in greedy] == [limit - 1 for limit in limits]  # ran to each
    # No limit but the model's (an infinite ratio, or one too large for a long): -2^63 before
    for ratio in (float("inf"), 1e20):
        assert max_output_lengths(b.src_mask, ratio, 30).tolist() == [30, 30]


@pytest.mark.parametrize("family", ["rnn", "transformer"])
@pytest.mark.parametrize("nbest,margin", [(3, None), (1, 0.05)])
def test_beam_attention_is_each_sentences_own(family, nbest, margin, random_batch):
    """Beams attend as query positions of their sentence's one memory row: each hypothesis'
    attention (every step, layer and head) equals that of the sentence decoded alone, also
    when pruning leaves sentences different numbers of beams."""
    model = _model(family, "scaled_dot")
    b = random_batch
    together = beam_search(model, b.src, b.src_mask, beam_size=3, nbest=nbest, need_attn=True,
                           prune_margin=margin)
    for i in range(b.src.size(0)):
        length = int(b.src_mask[i].sum())
        alone = beam_search(model, b.src[i : i + 1, :length], b.src_mask[i : i + 1, :length],
                            beam_size=3, nbest=nbest, need_attn=True, prune_margin=margin)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together[i]]
        for x, y in zip(alone, together[i]):
            torch.testing.assert_close(y.attention[..., :length], x.attention, atol=1e-5, rtol=1e-4)
            assert torch.all(y.attention[..., length:] == 0)


def test_beam_attention_rows_match_tokens(random_batch):
    model = _model("rnn", "additive")
    b = random_batch
    for i, hyps in enumerate(beam_search(model, b.src, b.src_mask, beam_size=3, need_attn=True)):
        hyp = hyps[0]
        assert hyp.attention.shape == (len(hyp.tokens) + 1, b.src.size(1))
        torch.testing.assert_close(hyp.attention.sum(-1), torch.ones(len(hyp.tokens) + 1))
        assert torch.all(hyp.attention[:, ~b.src_mask[i]] == 0)


@pytest.mark.parametrize("family", ["rnn", "transformer"])
def test_greedy_attention_changes_nothing_and_is_beam_ones(family, random_batch):
    """Asking greedy search for the attention gives the same tokens and scores, and each
    hypothesis' attention is what beam search of width 1 finds: one row per step, EOS's too."""
    model, b = _model(family, "general"), random_batch
    plain = greedy_search(model, b.src, b.src_mask)
    drawn = greedy_search(model, b.src, b.src_mask, need_attn=True)
    beam = beam_search(model, b.src, b.src_mask, beam_size=1, alpha=0.0, need_attn=True)
    for i, (p, d, (one,)) in enumerate(zip(plain, drawn, beam)):
        assert (d.tokens, d.log_prob) == (p.tokens, p.log_prob) and p.attention is None
        assert d.tokens == one.tokens and d.attention.shape[0] == len(d.tokens) + 1
        torch.testing.assert_close(d.attention, one.attention, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(d.attention.sum(-1), torch.ones(d.attention.shape[:-1]))
        assert torch.all(d.attention[..., ~b.src_mask[i]] == 0)


class ScriptedModel(torch.nn.Module):
    """A stand-in model whose next-token distribution depends only on the previous token:
    ``after_bos`` after BOS, ``later`` after any other token ({token: probability})."""

    max_positions = 64

    def __init__(self, after_bos: dict[int, float], later: dict[int, float]):
        super().__init__()
        self.after_bos, self.later = after_bos, later

    def encode(self, src, src_mask):
        return {"mask": src_mask}

    def init_state(self, memory):
        return None

    def decode_step(self, prev, state, memory, need_attn=False, beams=None):
        probs = torch.zeros(prev.size(0), 6)
        for row, token in enumerate(prev.tolist()):
            for word, p in (self.after_bos if token == BOS else self.later).items():
                probs[row, word] = p
        return probs.log(), state, None


def test_a_hypothesis_cut_at_the_length_limit_pays_for_its_eos():
    """Source of 1 piece + EOS, ratio 1: at most 7 output pieces (6 words + a forced EOS).
    The forced EOS costs the model's log(1e-4), so the empty hypothesis (EOS first, log 0.3)
    wins; scoring the forced EOS 0 would have made '5 5 5 5 5 5' win with log 0.6."""
    # After a word, another word almost surely: a hypothesis that starts with one runs on.
    model = ScriptedModel({EOS: 0.3, 5: 0.6, 4: 0.1}, {EOS: 1e-4, 5: 1 - 1e-4})
    b = collate([(0, [7], [7])])
    cut = math.log(0.6) + 5 * math.log(1 - 1e-4) + math.log(1e-4)
    greedy = greedy_search(model, b.src, b.src_mask, max_len_ratio=1.0)[0]
    assert greedy.tokens == [5] * 6 and greedy.log_prob == pytest.approx(cut)
    hyps = beam_search(model, b.src, b.src_mask, beam_size=2, alpha=0.0, max_len_ratio=1.0,
                       nbest=2)[0]
    assert [h.tokens for h in hyps] == [[], [5] * 6]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.3), cut])


@pytest.mark.parametrize("width,k", [(8000, 10), (40000, 10), (8000, 1), (300, 10), (8003, 10)])
def test_top_k_returns_the_values_and_positions_of_torch_topk(width, k):
    """Blockwise (widths that split into blocks) and fallback (300: too few blocks to skip;
    8003: no whole blocks) alike; rows with -inf (restricted tokens) and with the top k
    crowded into one block."""
    torch.manual_seed(width + k)
    x = torch.randn(6, width)
    x[1, : width // 2] = float("-inf")
    x[2, 5 : 5 + k] += 100.0  # all of the top k in one block
    x[3] = float("-inf")
    x[3, EOS] = -2.0  # a row that must end: one finite value
    values, positions = top_k(x, k)
    expected = x.topk(k, dim=-1).values
    assert torch.equal(values, expected)
    assert torch.equal(x.gather(1, positions), values)  # positions point at those values
    assert all(len(set(row)) == k for row in positions.tolist())
    strided = torch.stack([x, x], dim=1)[:, 1]  # rows that are not contiguous in memory
    assert torch.equal(top_k(strided, k)[0], expected)


def test_a_longer_hypothesis_that_overtakes_by_its_length_penalty_is_found():
    """With alpha 1 the empty hypothesis (log 0.5, lp 1) ends first, but '5' (log 0.45 +
    log 0.999, lp 7/6) scores higher: the search must not stop as if the live hypothesis
    could not catch up, because its length penalty may still grow."""
    model = ScriptedModel({EOS: 0.5, 5: 0.45, 4: 0.05}, {EOS: 0.999, 5: 0.001})
    b = collate([(0, [7], [7])])
    hyps = beam_search(model, b.src, b.src_mask, beam_size=2, alpha=1.0, nbest=1)[0]
    assert [h.tokens for h in hyps] == [[5]]
    assert hyps[0].score == pytest.approx((math.log(0.45) + math.log(0.999)) / (7 / 6))


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


def reference_beam_search(model, src, src_mask, k, alpha, max_len_ratio, nbest, margin=None):
    """The plainest beam search for one sentence (1, S): K beams over full vocabularies, the
    best 2K candidates per step, the first K hypotheses to end kept; no shortcuts. With a
    margin, the beams more than it below the best continuing one are dropped. A candidate of
    an empty beam (-inf) that ends in EOS is no hypothesis: with K near the vocabulary's size
    the best K candidates hold such ones."""
    encoded = model.encode(src, src_mask)
    state = select_rows(model.init_state(encoded), torch.zeros(k, dtype=torch.long))  # K rows
    max_len = int(max_output_lengths(src_mask, max_len_ratio, model.max_positions))
    beams = [([], 0.0)] + [([], float("-inf"))] * (k - 1)  # (tokens, log-prob)
    finished = []
    for step in range(max_len):
        prev = torch.tensor([tokens[-1] if tokens else BOS for tokens, _ in beams])
        memory = select_rows(encoded, torch.zeros(len(beams), dtype=torch.long))  # per beam
        log_probs, state, _ = model.decode_step(prev, state, memory)
        restrict(log_probs, torch.full((len(beams),), step >= max_len - 1))
        total = torch.tensor([s for _, s in beams]).unsqueeze(1) + log_probs  # (K, V)
        top, ids = total.view(-1).topk(min(2 * k, total.numel()))  # a tiny vocabulary has fewer
        candidates = [(int(i) // total.size(1), int(i) % total.size(1), float(s))
                      for s, i in zip(top, ids)]
        for beam, token, score in candidates[:k]:
            if token == EOS and score > float("-inf") and len(finished) < k:
                tokens = beams[beam][0]
                finished.append(Hypothesis(tokens, score, length_penalty(len(tokens) + 1, alpha)))
        if len(finished) >= k:
            break
        going = [c for c in candidates if c[1] != EOS][:k]
        if margin is not None:
            going = [c for c in going if c[2] >= going[0][2] - margin]
        state = select_rows(state, torch.tensor([beam for beam, _, _ in going]))
        beams = [(beams[beam][0] + [token], score) for beam, token, score in going]
    return sorted(finished, key=lambda h: -h.score)[:nbest]


class MarkovModel(torch.nn.Module):
    """A stand-in model whose next token depends on the previous one, the position and the
    sentence's first source token, through random tables: peaked enough that hypotheses end
    at many different lengths, so sentences are done early by the bound as well as by the
    count. The position term keeps hypotheses that repeat a cycle at different places from
    tying exactly (the order among exact ties is arbitrary)."""

    max_positions = 64

    def __init__(self, vocab: int = 20, sharpness: float = 2.0, seed: int = 0):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.transition = torch.randn(vocab, vocab, generator=generator) * sharpness
        self.transition[:, EOS] += 1.0
        self.source = torch.randn(vocab, vocab, generator=generator)
        self.position = torch.randn(self.max_positions, vocab, generator=generator) * 0.5

    def encode(self, src, src_mask):
        return {"bias": self.source[src[:, 0]]}  # (B, V)

    def init_state(self, memory):
        return 0  # the position: the same for every row, so not reordered by select_rows

    def decode_step(self, prev, state, memory, need_attn=False, beams=None):
        sentences = len(memory["bias"])
        width = len(prev) // sentences if beams is None else beams.width
        slots = torch.arange(len(prev)) if beams is None else beams.slots
        bias = memory["bias"][slots // width] + self.position[state]  # each row's sentence's
        return (self.transition[prev] + bias).log_softmax(-1), state + 1, None


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("alpha,nbest", [(0.0, 1), (0.6, 1), (0.6, 3), (1.0, 2)])
def test_beam_search_returns_what_the_plainest_beam_search_returns(seed, alpha, nbest):
    """The batched search (first step on one beam, sentences that are done by a bound
    leaving early) finds the same n-best lists as a plain search that waits for K."""
    model = MarkovModel(seed=seed)
    b = reversal_batch(random.Random(seed), 8, max_len=10)
    batched = beam_search(model, b.src, b.src_mask, beam_size=4, alpha=alpha, nbest=nbest)
    _assert_same_as_reference(model, b, batched, alpha, nbest)


@pytest.mark.parametrize("family,attention", [("rnn", "additive"), ("rnn", "general"),
                                              ("transformer", "scaled_dot")])
def test_beam_search_of_a_real_model_returns_what_the_plainest_beam_search_returns(
        family, attention, random_batch):
    """The same on the models themselves: the RNN's state is per row (the reference handed
    its one-row state to K beams, and could not run one), the Transformer's a growing cache."""
    model = _model(family, attention)
    with torch.no_grad():
        batched = beam_search(model, random_batch.src, random_batch.src_mask, beam_size=4,
                              alpha=0.6, nbest=2)
        _assert_same_as_reference(model, random_batch, batched, 0.6, 2)


def _assert_same_as_reference(model, b, batched, alpha, nbest, margin=None):
    for i, hyps in enumerate(batched):
        length = int(b.src_mask[i].sum())
        plain = reference_beam_search(model, b.src[i : i + 1, :length],
                                      b.src_mask[i : i + 1, :length], 4, alpha, 1.5, nbest, margin)
        assert [h.tokens for h in hyps] == [h.tokens for h in plain]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in plain], abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("alpha,margin", [(0.6, 0.5), (0.6, 2.0), (0.0, 1.0)])
def test_pruned_beam_search_returns_what_the_plainest_pruned_search_returns(seed, alpha, margin):
    """With a prune margin, sentences keep from 1 to K beams: the batched search (rows of
    live hypotheses only) finds what the plain search that drops them finds."""
    model = MarkovModel(seed=seed)
    b = reversal_batch(random.Random(seed), 8, max_len=10)
    rows = count_rows(model)
    batched = beam_search(model, b.src, b.src_mask, beam_size=4, alpha=alpha, prune_margin=margin)
    pruned, rows[0] = rows[0], 0
    beam_search(model, b.src, b.src_mask, beam_size=4, alpha=alpha)
    assert pruned < rows[0]  # the margin pruned
    _assert_same_as_reference(model, b, batched, alpha, 1, margin)


def test_an_nbest_search_is_never_pruned(random_batch):
    """Pruning would cut n-best lists short: with nbest > 1 the margin is ignored."""
    model, b = _model("transformer", "dot"), random_batch
    full = beam_search(model, b.src, b.src_mask, beam_size=4, nbest=3)
    asked = beam_search(model, b.src, b.src_mask, beam_size=4, nbest=3, prune_margin=0.0)
    assert [[h.tokens for h in hyps] for hyps in asked] == [[h.tokens for h in hyps] for hyps in full]
    assert all(len(hyps) == 3 for hyps in asked)


@pytest.mark.parametrize("vocab", [4, 5])
def test_a_beam_as_wide_as_the_vocabulary_carries_no_ended_hypothesis_on(vocab):
    """With K >= the tokens a row can continue with (here UNK, 4 and EOS), a sentence has
    fewer than K candidates that did not end: those ending in EOS must not fill its beam
    (they carried on with EOS inside their tokens). The n-best list as long as the beam:
    each entry a hypothesis that ended, none a candidate of an empty beam."""
    model = MarkovModel(vocab=vocab, seed=0)
    b = reversal_batch(random.Random(0), 8, max_len=10)
    b = SimpleNamespace(src=b.src % vocab, src_mask=b.src_mask)  # the model's first tokens
    batched = beam_search(model, b.src, b.src_mask, beam_size=4, alpha=0.6, nbest=4)
    assert all(EOS not in h.tokens and math.isfinite(h.score) for hyps in batched for h in hyps)
    _assert_same_as_reference(model, b, batched, 0.6, 4)
