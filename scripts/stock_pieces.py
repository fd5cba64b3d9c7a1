"""PyTorch's stock pieces in place of the model's own implementations, for the benchmarks.

The model computes the same functions as a textbook model, but three of its pieces are our
own implementations chosen for speed on a CPU (docs/performance.md): dropout masks drawn by
``nmt.dropout`` instead of ``bernoulli_``, the explicit matmul-softmax-matmul attention below
512 x 512 scores instead of PyTorch's fused ``scaled_dot_product_attention``, and the additive
scorer through sigmoid instead of tanh. ``use_stock_pieces`` swaps any of them back for what
a user writing the model with PyTorch's building blocks would call: same math, same weights.
"""

from __future__ import annotations

from contextlib import ExitStack
from unittest import mock

import torch
import torch.nn.functional as F
from bench_additive_sigmoid import TANH

import nmt.attention
import nmt.dropout
from nmt.attention import AdditiveScorer, ScaledDotScorer


def torch_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return F.dropout(x, p, training)


def use_stock_pieces(patches: ExitStack, dropout: bool = True, fused_attention: bool = True,
                     tanh_additive: bool = True) -> None:
    """Enter into ``patches`` the swaps asked for; they last as long as the stack.
    ``dropout``: torch's dropout (``bernoulli_`` masks) for nmt.dropout's; ``fused_attention``:
    the fused kernel at every length (scaled dot-product); ``tanh_additive``: v^T tanh(W q + U k)
    as written."""
    if dropout:
        patches.enter_context(mock.patch.object(nmt.dropout, "dropout", torch_dropout))
        patches.enter_context(mock.patch.object(nmt.attention, "apply_dropout", torch_dropout))
    if fused_attention:
        patches.enter_context(mock.patch.object(ScaledDotScorer, "FUSED_CPU_MIN_SCORES", 0))
    if tanh_additive:
        patches.enter_context(mock.patch.multiple(AdditiveScorer, **TANH))
