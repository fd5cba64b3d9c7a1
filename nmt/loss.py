"""Label-smoothed cross-entropy computed a few rows at a time, so it stays in the CPU's cache.

For logits x (N, V), a target t_i and smoothing eps, per row (Szegedy et al. 2016, as
``F.cross_entropy(..., label_smoothing=eps)`` defines it):

    loss_i = (1 - eps) (lse_i - x_i[t_i]) + eps (lse_i - mean_j x_ij),   lse_i = log sum_j exp x_ij
    d loss_i / d x_ij = softmax(x_i)_j - (1 - eps) [j = t_i] - eps / V

and the loss is the mean over rows whose target is not ``ignore_index`` (0 if there is none).

Why not ``F.cross_entropy(logits.float(), ...)``: with (tokens, vocab) logits of 4,096 x 8,000
each pass over them moves 131 MB in fp32, and that path makes about a dozen (the fp32 copy,
log_softmax, the smoothing sum, the zero-filled NLL gradient, the sum of the two gradients,
log_softmax's backward, the cast back), which a 2-core machine's memory bandwidth turns into a
fifth of an RNN training step. Here each block of rows is read in its own precision, computed on
in fp32 while it fits in cache, and the gradient is written once in the logits' dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 2**19  # fp32 working set of one block of rows: 2 MB, about one core's L2


def _rows_per_block(logits: Tensor) -> int:
    """Rows whose fp32 copy fits in CHUNK_ELEMENTS on CPU; on an accelerator one block (kernel
    launches, not cache, are what many small blocks would cost there)."""
    if logits.device.type != "cpu":
        return max(1, logits.size(0))
    return max(1, CHUNK_ELEMENTS // max(1, logits.size(1)))


class SmoothedCrossEntropy(torch.autograd.Function):
    """``loss = SmoothedCrossEntropy.apply(logits (N, V), target (N,), eps, ignore_index)``."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float, ignore_index: int) -> Tensor:
        rows = _rows_per_block(logits)
        keep = target != ignore_index  # (N,)
        target = target.masked_fill(~keep, 0)  # a valid index on ignored rows (-100 is not)
        lse = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)  # (N,)
        total = logits.new_zeros((), dtype=torch.float32)
        for start in range(0, logits.size(0), rows):
            block = slice(start, start + rows)
            x = logits[block].float()  # (n, V)
            lse[block] = torch.logsumexp(x, dim=-1)
            picked = x.gather(1, target[block, None]).squeeze(1)  # x_i[t_i]
            row_loss = lse[block] - (1 - eps) * picked - eps * x.mean(dim=-1)
            total += torch.where(keep[block], row_loss, 0.0).sum()  # an ignored inf stays out
        count = keep.sum()
        ctx.save_for_backward(logits, target, lse, keep, count)
        ctx.eps = eps
        return total / count.clamp(min=1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss: Tensor):
        logits, target, lse, keep, count = ctx.saved_tensors
        eps = ctx.eps
        scale = keep * (grad_loss / count.clamp(min=1))  # (N,): 0 on ignored rows
        grad = torch.empty_like(logits)
        rows = _rows_per_block(logits)
        for start in range(0, logits.size(0), rows):
            block = slice(start, start + rows)
            g = (logits[block].float() - lse[block, None]).exp_()  # softmax: (n, V)
            g.sub_(eps / logits.size(1))
            g.scatter_add_(1, target[block, None], g.new_full((g.size(0), 1), eps - 1))
            grad[block] = g.mul_(scale[block, None])
        return grad, None, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, eps: float = 0.0,
                           ignore_index: int = -100) -> Tensor:
    """Mean label-smoothed cross-entropy of (N, V) logits (any float dtype) against (N,)
    targets, over rows whose target is not ``ignore_index``; the same value and gradient as
    ``F.cross_entropy(logits.float(), target, ignore_index=..., label_smoothing=eps)``, except
    that no row to count (every target ignored, or none) gives 0 where torch gives NaN."""
    return SmoothedCrossEntropy.apply(logits, target, eps, ignore_index)
