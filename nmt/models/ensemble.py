"""Several trained models decoding as one (``nmt translate --ensemble``).

At each step the ensemble's next-token distribution is the mean of its members'
probabilities, as in fairseq's ``EnsembleModel``:

    log p(y | x, y<t) = log (1/M) sum_m p_m(y | x, y<t) = logsumexp_m(log p_m) - log M

(Marian combines in log space instead: a weighted sum of the members' log-probabilities, a
weighted product of their distributions, not renormalised: src/translator/beam_search.cpp.)

Any members that share one SentencePiece model can be ensembled, an RNN with a Transformer
too: the ensemble offers the ``Seq2Seq`` decoding interface (``nmt.models.base``) with each
member's memory and state kept side by side in a list, so search reorders them all with
``select_rows`` without knowing what they are. It is not a family of its own (nothing trains
it): ``nmt.translator`` builds it from trained runs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt.models.base import Beams


def mean_of_probabilities(log_probs: list[Tensor]) -> Tensor:
    """M tensors of log-probabilities (..., V) -> the log of their mean probability (..., V)."""
    return torch.logsumexp(torch.stack(log_probs), dim=0) - math.log(len(log_probs))


class Ensemble(nn.Module):
    """M members with the ``Seq2Seq`` interface, over one vocabulary; the first member's
    attention is the ensemble's (the members' may differ in shape: (B, S) for an RNN,
    (B, L, H, S) for a Transformer)."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.max_positions = min(m.max_positions for m in members)

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: (B, S), (B, S), (B, T) -> log-probabilities (B, T, V), which are
        logits too (their softmax is the mean of the members' distributions)."""
        return mean_of_probabilities([torch.log_softmax(m(src, src_mask, tgt_in).float(), dim=-1)
                                      for m in self.members])

    def encode(self, src: Tensor, src_mask: Tensor) -> list:
        return [m.encode(src, src_mask) for m in self.members]

    def init_state(self, memory: list) -> list:
        return [m.init_state(mem) for m, mem in zip(self.members, memory)]

    def decode_step(self, prev: Tensor, state: list, memory: list, need_attn: bool = False,
                    beams: Beams | None = None) -> tuple[Tensor, list, Tensor | None]:
        """(B,) -> log-probs (B, V) of the mean distribution, each member's new state, and
        the first member's attention (or None)."""
        steps = [m.decode_step(prev, s, mem, need_attn and i == 0, beams)
                 for i, (m, s, mem) in enumerate(zip(self.members, state, memory))]
        log_probs = mean_of_probabilities([lp for lp, _, _ in steps])
        return log_probs, [s for _, s, _ in steps], steps[0][2]

    def set_dropout(self, p: float) -> None:
        for m in self.members:
            m.set_dropout(p)
