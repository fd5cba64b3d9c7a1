"""Greedy and beam search over the ``Seq2Seq`` decoding interface (family-agnostic).

Beam search is batched over sentences x beam. Each step scores every continuation of the
K live hypotheses, keeps the best 2K candidates, moves those ending in EOS (among the top
K) to the sentence's finished list, and continues with the best K that did not end.
A sentence is done when it has K finished hypotheses, or as soon as no live hypothesis can
still enter its n-best list (see ``Finished``); done sentences leave the batch. With a prune
margin, hypotheses far below their sentence's best live one leave it too, so sentences keep
1 to K beams and the batch holds one row per live hypothesis (``models.base.Beams``).
Final scores use the GNMT length penalty (Wu et al. 2016, eq. 14).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.tokenizer import BOS, EOS, PAD
from nmt.models.base import Beams, Seq2Seq, select_rows


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


# The largest alpha decoding takes (GNMT's are 0.6 to 2; ours 1.4): lp of a long output
# overflows a float from about alpha 100, and far below that a larger alpha only pushes
# every sentence to its longest output.
MAX_ALPHA = 10.0


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
    # Index the few rows that must end: a boolean mask would make a pass over every row.
    rows = must_end.nonzero().squeeze(1)
    if len(rows):
        eos = log_probs[rows, ..., EOS]  # (M, ...): a copy, taken before the rows are cleared
        log_probs[rows] = float("-inf")
        log_probs[rows, ..., EOS] = eos
    return log_probs


def top_k(x: Tensor, k: int, block: int = 100) -> tuple[Tensor, Tensor]:
    """``x.topk(k, dim=-1)`` for rows (n, W) with W >> k, in two cheap passes instead of one
    expensive one (torch's CPU topk costs ~12x a max over the same rows).

    The k largest values of a row lie in the k blocks (of ``block`` columns) with the
    largest maxima: a block holding one of them has a maximum at least the k-th largest
    value, and at most k blocks can hold one. So rank the block maxima, then run topk over
    the k chosen blocks only. Values equal those of ``x.topk``; among tied values the
    indices may differ, as they may between torch's own CPU and CUDA kernels.
    """
    n, width = x.shape
    count = width // block
    if width % block or count <= k:  # W not a whole number of blocks, or none to skip
        return x.topk(k, dim=-1)
    blocks = x.reshape(n * count, block)  # a view of contiguous rows
    chosen = blocks.view(n, count, block).amax(-1).topk(k, dim=-1).indices  # (n, k) block numbers
    # whole blocks by row number: 1.5x faster than a gather of each element (Zen 5, 1,500 rows)
    rows = (torch.arange(n, device=x.device).unsqueeze(1) * count + chosen).view(-1)  # (n * k,)
    candidates = blocks.index_select(0, rows).view(n, k * block)
    values, position = candidates.topk(k, dim=-1)
    return values, chosen.gather(1, position // block) * block + position % block


def max_output_lengths(src_mask: Tensor, ratio: float, cap: int) -> Tensor:
    """(B, S) -> (B,) output budget per sentence: ratio x source length + 5, at most cap."""
    # clamped before the cast: an infinite ratio (no limit but the cap) casts to -2^63
    return (src_mask.sum(1) * ratio + 5).clamp(max=cap).long()


@torch.no_grad()
def greedy_search(
    model: Seq2Seq, src: Tensor, src_mask: Tensor, max_len_ratio: float = 1.5,
    need_attn: bool = False,
) -> list[Hypothesis]:
    """Arg-max decoding for a batch: (B, S) -> one hypothesis per sentence. A sentence leaves
    the batch when it emits EOS, so each step costs what the sentences still running need.
    ``need_attn``: each hypothesis also carries its attention, and the search is otherwise
    the same (beam 1 gives one translation, whether its attention is asked for or not)."""
    memory = model.encode(src, src_mask)
    state = model.init_state(memory)
    max_lens = max_output_lengths(src_mask, max_len_ratio, model.max_positions)
    batch, device = src.size(0), src.device
    alive = torch.arange(batch, device=device)  # original index of each running sentence
    prev = torch.full((batch,), BOS, dtype=torch.long, device=device)
    tokens = torch.full((batch, int(max_lens.max())), EOS, dtype=torch.long, device=device)
    scores = torch.zeros(batch, device=device)
    attention = None  # (B, steps, ..., S) once the first step's attention shows its shape
    for step in range(tokens.size(1)):
        log_probs, state, attn = model.decode_step(prev, state, memory, need_attn)
        if need_attn:
            if attention is None:
                attention = attn.new_zeros((batch, tokens.size(1), *attn.shape[1:]), dtype=torch.float32)
            attention[alive, step] = attn.float()  # fp32 for callers, also under bf16 autocast
        restrict(log_probs, step >= max_lens[alive] - 1)
        best, prev = (column.squeeze(1) for column in top_k(log_probs, 1))  # (n,) each
        scores.index_add_(0, alive, best)
        tokens[alive, step] = prev
        running = prev != EOS
        if not running.all():  # drop the finished rows from the batch and its state
            left = running.nonzero().squeeze(1)
            if len(left) == 0:
                break
            alive, prev = alive[left], prev[left]
            state, memory = select_rows(state, left), select_rows(memory, left)
    rows = tokens.tolist()  # every row has an EOS: the last step forces one
    hyps = [Hypothesis(row[: row.index(EOS)], log_prob) for row, log_prob in zip(rows, scores.tolist())]
    if need_attn:
        for b, hyp in enumerate(hyps):
            hyp.attention = attention[b, : len(hyp.tokens) + 1]  # its steps, EOS included
    return hyps


@dataclass
class LiveBeams:
    """The hypotheses still searched. Slot i * width + j holds beam j of sentence ``alive[i]``;
    the decoding batch has one row per live hypothesis, in slot order (``slots``), so pruned
    beams and finished sentences cost no rows."""

    alive: Tensor  # (n,) original index of each sentence still searched
    width: int  # slots per sentence: 1 at the first step (BOS only), then K
    slots: Tensor  # (rows,) the slot of each batch row
    prefix: Tensor  # (rows, t) each row's tokens so far, BOS first
    scores: Tensor  # (n, width) each slot's log-probability; -inf: an empty slot

    @classmethod
    def first_step(cls, sentences: int, device: torch.device) -> LiveBeams:
        """One beam per sentence, holding BOS: K copies of it would only repeat the work."""
        rows = torch.arange(sentences, device=device)
        return cls(rows, 1, rows, torch.full((sentences, 1), BOS, dtype=torch.long, device=device),
                   torch.zeros(sentences, 1, device=device))

    def row_slots(self) -> Beams | None:
        """Which slots the batch rows are, for ``decode_step``; None when every slot has one."""
        return Beams(self.width, self.slots) if len(self.slots) < self.scores.numel() else None

    def carry_on(self, left: Tensor, keep: Tensor, next_scores: Tensor, token: Tensor,
                 source_rows: Tensor) -> tuple[LiveBeams, Tensor]:
        """The next step's beams: sentences ``left`` (n_left,) continue with the candidates
        ``keep`` (n, K) of the step's candidates (``token``, ``source_rows``: (n, C)), scored
        ``next_scores`` (n, K). Returns them and, for each of their rows, the current batch
        row it continues (its state is that row's, reordered)."""
        keep, live = keep[left], next_scores[left].isfinite()  # (n_left, K): slots with a row
        rows = source_rows[left].gather(1, keep)[live]
        prefix = torch.cat([self.prefix[rows], token[left].gather(1, keep)[live].unsqueeze(1)], dim=1)
        slots = live.view(-1).nonzero().squeeze(1)
        return LiveBeams(self.alive[left], keep.size(1), slots, prefix, next_scores[left]), rows


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
    prune_margin: float | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search: (B, S) -> for each sentence its ``nbest`` best hypotheses.

    ``prune_margin`` (nats; 1-best search only, an n-best list would lose entries): a live
    hypothesis whose log-probability falls more than this below its sentence's best live
    one is dropped (absolute threshold pruning, Freitag & Al-Onaizan 2017), and the batch
    shrinks by its row. None keeps all K, as fairseq does.
    """
    k = beam_size
    margin = prune_margin if nbest == 1 else None
    memory = model.encode(src, src_mask)  # one row per sentence, shared by its beams
    state = model.init_state(memory)
    max_lens = max_output_lengths(src_mask, max_len_ratio, model.max_positions)
    finished = Finished(max_lens, k, nbest, alpha)
    beams = LiveBeams.first_step(src.size(0), src.device)
    attn_rows = [] if need_attn else None  # per step: (rows, ..., S)

    for step in range(int(max_lens.max())):
        log_probs, state, attn = model.decode_step(beams.prefix[:, -1], state, memory, need_attn,
                                                   beams.row_slots())
        must_end = (step >= max_lens[beams.alive] - 1)[beams.slots // beams.width]  # (rows,)
        top_scores, source_rows, token = top_candidates(restrict(log_probs, must_end),
                                                        beams.scores, beams.slots, k)  # (n, C) each
        if need_attn:
            attn_rows.append(attn.float())  # fp32 for callers, also under bf16 autocast
        finished.add(beams.alive, token, top_scores, source_rows, beams.prefix, attn_rows)
        keep, next_scores = best_unfinished(token, top_scores, k, margin)
        left = (~finished.done(beams.alive, next_scores)).nonzero().squeeze(1)
        if len(left) == 0:
            break
        if len(left) < len(beams.alive):  # memory: one row per sentence, shared by its beams
            memory = select_rows(memory, left)
        beams, rows = beams.carry_on(left, keep, next_scores, token, source_rows)
        # The survivors' rows among the current ones: drops done sentences and pruned
        # hypotheses, reorders beams.
        state = select_rows(state, rows)
        if need_attn:
            attn_rows = [a[rows] for a in attn_rows]
    return finished.best()


def best_unfinished(token: Tensor, top_scores: Tensor, k: int, margin: float | None
                    ) -> tuple[Tensor, Tensor]:
    """The best K candidates of each sentence that did not end: token, top_scores (n, C),
    best first -> their positions (n, K) and scores (n, K). With a ``margin``, those more
    than it below the sentence's best score -inf (pruned: they get no row)."""
    positions = torch.arange(token.size(1), device=token.device)
    ended = token == EOS
    keep = (torch.where(ended, token.size(1), 0) + positions).argsort(dim=-1)[:, :k]  # EOS last
    # An EOS candidate is kept only where fewer than K did not end (K >= the vocabulary's
    # tokens): it gets no row.
    scores = top_scores.gather(1, keep).masked_fill(ended.gather(1, keep), float("-inf"))
    if margin is not None:
        best = scores.max(1, keepdim=True).values
        scores = scores.masked_fill(scores < best - margin, float("-inf"))
    return keep, scores


def top_candidates(log_probs: Tensor, scores: Tensor, slots: Tensor, k: int
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """The best C = min(2K, W * V) continuations of each sentence's hypotheses.

    log_probs (rows, V) of the next token, scores (n, W) of the n * W beam slots (-inf where
    empty), slots (rows,) the slot of each row -> scores (n, C), the rows they continue
    (n, C), and their tokens (n, C); where a sentence has fewer than C candidates, the rest
    score -inf. A hypothesis adds the same score to all its tokens, so a sentence's best C
    continuations are among the best C of each of its rows: rank within rows (the large
    pass), then within sentences over W * C candidates (a small one).
    """
    n, width = scores.shape
    c = min(2 * k, log_probs.size(1))  # per row
    row_best, row_token = top_k(log_probs, c)  # (rows, c)
    per_slot = row_best.new_full((n * width, c), float("-inf"))
    per_slot[slots] = row_best + scores.view(-1)[slots].unsqueeze(1)
    top_scores, position = per_slot.view(n, width * c).topk(min(2 * k, width * c), dim=-1)
    row_of_slot = torch.zeros(n * width, dtype=torch.long, device=slots.device)
    row_of_slot[slots] = torch.arange(len(slots), device=slots.device)
    slot = torch.arange(n, device=slots.device).unsqueeze(1) * width + position // c
    rows = row_of_slot[slot]  # (n, C); an empty slot's -inf candidates point at row 0
    return top_scores, rows, row_token[rows, position % c]


class Finished:
    """Each sentence's finished hypotheses: at most K, the first K to end, as fairseq keeps.

    A sentence is done when it has K of them, or earlier when no live hypothesis can still
    enter its ``nbest`` best: a live hypothesis of log-probability s can only lose
    probability, and its length penalty is at most that of the longest output allowed, so
    its final score is at most s / lp(max length) (for alpha >= 0). Stopping there returns
    the same ``nbest`` hypotheses as waiting for K.
    """

    def __init__(self, max_lens: Tensor, k: int, nbest: int, alpha: float):
        self.k, self.nbest, self.alpha = k, nbest, alpha
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(len(max_lens))]
        # The best score a live hypothesis could still reach is s / this (float64, and the
        # penalty computed as for the finished ones, so equal scores compare equal).
        penalties = [length_penalty(int(n), alpha) for n in max_lens.tolist()]
        self.max_penalty = torch.tensor(penalties, dtype=torch.float64, device=max_lens.device)
        self.count = torch.zeros(len(max_lens), dtype=torch.long, device=max_lens.device)
        self.nth_best = torch.full((len(max_lens),), float("-inf"), dtype=torch.float64,
                                   device=max_lens.device)

    def add(self, alive: Tensor, token: Tensor, top_scores: Tensor, source_rows: Tensor,
            prefix: Tensor, attn_rows: list[Tensor] | None) -> None:
        """Move candidates ending in EOS among each sentence's top K to its list: token,
        top_scores, source_rows (n, C) from ``top_candidates``; prefix (rows, t)."""
        ended = (token[:, : self.k] == EOS) & top_scores[:, : self.k].isfinite()
        sentence, position = ended.nonzero().unbind(1)
        if len(sentence) == 0:
            return
        rows = source_rows[sentence, position]
        owners = alive[sentence].tolist()
        for b, row, tokens, log_prob in zip(owners, rows.tolist(), prefix[rows, 1:].tolist(),
                                            top_scores[sentence, position].tolist()):
            if len(self.hyps[b]) >= self.k:
                continue
            attention = torch.stack([a[row] for a in attn_rows]) if attn_rows is not None else None
            penalty = length_penalty(len(tokens) + 1, self.alpha)
            self.hyps[b].append(Hypothesis(tokens, log_prob, penalty, attention))
        touched = sorted(set(owners))
        self.count[touched] = torch.tensor([len(self.hyps[b]) for b in touched],
                                           device=self.count.device)
        if self.alpha >= 0:  # else the length penalty shrinks with length: no bound
            self.nth_best[touched] = torch.tensor([self._nth_best(b) for b in touched],
                                                  dtype=torch.float64, device=self.count.device)

    def _nth_best(self, b: int) -> float:
        scores = sorted((h.score for h in self.hyps[b]), reverse=True)
        return scores[self.nbest - 1] if len(scores) >= self.nbest else float("-inf")

    def done(self, alive: Tensor, live_scores: Tensor) -> Tensor:
        """(n,) whether each alive sentence is done, given its live hypotheses' log-probs
        (n, K) for the next step (-inf: none in that slot)."""
        best = live_scores.max(1).values
        bound = best.double() / self.max_penalty[alive]
        count = self.count[alive]
        return ((count >= self.k) | ((count >= self.nbest) & (self.nth_best[alive] >= bound))
                | best.isneginf())

    def best(self) -> list[list[Hypothesis]]:
        """Each sentence's ``nbest`` best hypotheses, best first."""
        return [sorted(hyps, key=lambda h: -h.score)[: self.nbest] for hyps in self.hyps]
