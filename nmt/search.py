"""Greedy and beam search over the ``Seq2Seq`` decoding interface (family-agnostic).

Beam search is batched over sentences x beam. Each step scores every continuation of the
K live hypotheses, keeps the best 2K candidates, moves those ending in EOS (among the top
K) to the sentence's finished list, and continues with the best K that did not end.
A sentence is done when it has K finished hypotheses; done sentences leave the batch.
Final scores use the GNMT length penalty (Wu et al. 2016, eq. 14).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.models.base import Seq2Seq, select_rows


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    log_prob: float  # the model's log-probability of tokens + EOS
    penalty: float = 1.0  # length penalty lp(len(tokens) + 1); greedy search uses none
    attention: Tensor | None = None  # (len(tokens) + 1, ..., S): per step, EOS included

    @property
    def score(self) -> float:
        """The length-normalised log-probability that ranks hypotheses."""
        return self.log_prob / self.penalty


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT: lp(Y) = ((5 + |Y|) / 6) ^ alpha; alpha = 0 gives 1 (raw log-probability)."""
    return ((5 + length) / 6) ** alpha


def restrict(log_probs: Tensor, must_end: Tensor) -> Tensor:
    """Never emit PAD or BOS; where ``must_end`` (out of length budget) emit only EOS.

    A forced EOS keeps the model's own log-probability (as fairseq does): scoring it 0 would
    give hypotheses cut at the length limit a bonus over those that ended by themselves.
    log_probs (N, ..., V) with ``must_end`` (N,) boolean; changed in place.
    """
    log_probs[..., PAD] = float("-inf")
    log_probs[..., BOS] = float("-inf")
    eos = log_probs[must_end, ..., EOS]  # (M, ...): a copy, taken before the row is cleared
    log_probs[must_end] = float("-inf")
    log_probs[must_end, ..., EOS] = eos
    return log_probs


def max_output_lengths(src_mask: Tensor, ratio: float, cap: int) -> Tensor:
    """(B, S) -> (B,) output budget per sentence: ratio x source length + 5, at most cap."""
    return (src_mask.sum(1) * ratio + 5).long().clamp(max=cap)


@torch.no_grad()
def greedy_search(
    model: Seq2Seq, src: Tensor, src_mask: Tensor, max_len_ratio: float = 1.5
) -> list[Hypothesis]:
    """Arg-max decoding for a batch: (B, S) -> one hypothesis per sentence."""
    memory = model.encode(src, src_mask)
    state = model.init_state(memory)
    max_lens = max_output_lengths(src_mask, max_len_ratio, model.max_positions)
    batch = src.size(0)
    prev = torch.full((batch,), BOS, dtype=torch.long, device=src.device)
    tokens, scores = [], torch.zeros(batch, device=src.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    for step in range(int(max_lens.max())):
        log_probs, state, _ = model.decode_step(prev, state, memory)
        restrict(log_probs, step >= max_lens - 1)
        best, prev = log_probs.max(-1)
        scores += best.masked_fill(done, 0.0)
        tokens.append(prev)
        done |= prev == EOS
        if done.all():
            break
    rows = torch.stack(tokens, 1).tolist()
    return [
        Hypothesis(row[: row.index(EOS)] if EOS in row else row, log_prob)
        for row, log_prob in zip(rows, scores.tolist())
    ]


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    src_mask: Tensor,
    beam_size: int = 5,
    alpha: float = 0.6,
    max_len_ratio: float = 1.5,
    nbest: int = 1,
    need_attn: bool = False,
) -> list[list[Hypothesis]]:
    """Batched beam search: (B, S) -> for each sentence its ``nbest`` best hypotheses."""
    batch, k = src.size(0), beam_size
    device = src.device
    # Every sentence's memory, repeated K times: row b * K + j is beam j of sentence b.
    expand = torch.arange(batch, device=device).repeat_interleave(k)
    memory = select_rows(model.encode(src, src_mask), expand)
    state = model.init_state(memory)
    max_lens = max_output_lengths(src_mask, max_len_ratio, model.max_positions)
    alive = torch.arange(batch, device=device)  # original index of each sentence in the batch
    prefix = torch.full((batch * k, 1), BOS, dtype=torch.long, device=device)
    attn_rows = [] if need_attn else None  # per step: (n * K, ..., S)
    # Only beam 0 is live at the start, so the K beams do not all pick the same first token.
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    for step in range(int(max_lens.max())):
        log_probs, state, attn = model.decode_step(prefix[:, -1], state, memory, need_attn)
        vocab = log_probs.size(-1)
        log_probs = log_probs.view(len(alive), k, vocab)
        restrict(log_probs, step >= max_lens[alive] - 1)
        candidates = (scores.unsqueeze(-1) + log_probs).view(len(alive), k * vocab)
        top_scores, top_ids = candidates.topk(2 * k, dim=-1)  # (n, 2K)
        beam, token = top_ids // vocab, top_ids % vocab
        source_rows = (torch.arange(len(alive), device=device).unsqueeze(1) * k + beam)  # (n, 2K)
        if need_attn:
            attn_rows.append(attn)

        _finish(finished, alive, token, top_scores, source_rows, prefix, attn_rows, k, alpha)
        done = torch.tensor([len(finished[b]) >= k for b in alive.tolist()], device=device)

        # Continue with the best K candidates that did not end, in sentences not done.
        rank = torch.where(token == EOS, 2 * k, 0) + torch.arange(2 * k, device=device)
        keep = rank.argsort(dim=-1)[:, :k]  # (n, K) positions of the best K non-EOS
        keep = keep[~done]
        n_left = keep.size(0)
        if n_left == 0:
            break
        left = (~done).nonzero().squeeze(1)
        rows = source_rows[left].gather(1, keep).view(-1)  # (n_left * K,) rows to carry on
        scores = top_scores[left].gather(1, keep)
        new_tokens = token[left].gather(1, keep).view(-1, 1)
        prefix = torch.cat([prefix[rows], new_tokens], dim=1)
        if need_attn:
            attn_rows = [a[rows] for a in attn_rows]
        # Rows of the survivors, among all current rows: drops done sentences, reorders beams.
        state = select_rows(state, rows)
        if len(left) < len(alive):  # the K beams of a sentence share one memory: only drop
            memory = select_rows(memory, (left.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1))
        alive = alive[left]
    return [sorted(hyps, key=lambda h: -h.score)[:nbest] for hyps in finished]


def _finish(finished, alive, token, top_scores, source_rows, prefix, attn_rows, k, alpha):
    """Move candidates ending in EOS among each sentence's top K to its finished list."""
    ends = (token[:, :k] == EOS).nonzero().tolist()
    for sentence, position in ends:
        b = alive[sentence].item()
        if len(finished[b]) >= k:
            continue
        row = source_rows[sentence, position].item()
        tokens = prefix[row, 1:].tolist()
        log_prob = top_scores[sentence, position].item()
        attention = torch.stack([a[row] for a in attn_rows]) if attn_rows is not None else None
        finished[b].append(Hypothesis(tokens, log_prob, length_penalty(len(tokens) + 1, alpha),
                                      attention))
