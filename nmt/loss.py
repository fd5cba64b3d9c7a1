"""Label-smoothed cross-entropy (Szegedy et al. 2016) with a hand-written backward.

For logits x over V classes, target y and smoothing e the target distribution is
q = (1 - e) onehot(y) + e / V, and

    loss = logsumexp(x) - (1 - e) x_y - (e / V) sum_v x_v
    dloss/dx = softmax(x) - q

``F.cross_entropy(..., label_smoothing=e)`` computes the same value through log_softmax, an
NLL term and a smoothing term, whose backward passes make several (N, V) temporaries; on a
CPU with V = 8000 those passes cost about a fifth of a Transformer training step. Here the
backward is one pass: softmax recomputed from the saved logsumexp, minus q.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float, ignore_index: int):
        """logits (N, V), target (N,) -> summed loss over non-ignored rows, their count."""
        ctx.dtype = logits.dtype  # bf16 under autocast: the loss itself is computed in fp32
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        keep = target != ignore_index  # (N,)
        safe_target = target.masked_fill(~keep, 0)
        lse = torch.logsumexp(logits, dim=-1)  # (N,)
        gold = logits.gather(1, safe_target.unsqueeze(1)).squeeze(1)
        per_row = lse - (1 - smoothing) * gold - smoothing * logits.mean(-1)
        count = keep.sum()
        ctx.save_for_backward(logits, lse, safe_target, keep)
        ctx.smoothing = smoothing
        return (per_row * keep).sum(), count

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_count):
        logits, lse, target, keep = ctx.saved_tensors
        e = ctx.smoothing
        grad = torch.exp(logits - lse.unsqueeze(1))  # softmax, (N, V)
        grad.sub_(e / logits.size(1))
        grad.scatter_add_(1, target.unsqueeze(1), torch.full_like(lse, e - 1).unsqueeze(1))
        grad.mul_((grad_loss * keep).unsqueeze(1))  # ignored rows get no gradient
        return grad.to(ctx.dtype), None, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, smoothing: float,
                           ignore_index: int) -> tuple[Tensor, Tensor]:
    """Mean label-smoothed cross-entropy over the non-ignored targets, and their count.

    logits (N, V), target (N,) -> (scalar loss, scalar count); equals
    ``F.cross_entropy(logits, target, ignore_index=..., label_smoothing=smoothing)``.
    """
    total, count = _SmoothedCrossEntropy.apply(logits, target, smoothing, ignore_index)
    return total / count.clamp(min=1), count
