"""One cast for a tensor that several matmuls read under autocast.

Autocast casts a matmul's fp32 input to bf16 (or fp16) at every call: a weight only once per
step (its cast cache, ``trainer.CachedMixedPrecision``), an activation at every use, and
each cast's backward casts a gradient back. Where one activation feeds several matmuls, cast
it once before them.
"""

from __future__ import annotations

import torch
from torch import Tensor


def in_autocast_dtype(x: Tensor) -> Tensor:
    """``x`` in the dtype autocast runs matmuls in, where autocast is on for its device;
    ``x`` itself otherwise (fp32 runs are untouched).

    Uses: the RNN's annotations, which every decoder step reads in a matmul (its encoder's
    GRU runs in fp32 also under autocast, which has no rule for it): cast once instead of at
    each of the T steps, the bf16 RNN training step ran 1.05x faster; the Transformer's
    attention inputs, read by three projections (self-attention) or, for the encoder output,
    by two in each decoder layer: 1.01x (2-core AMD EPYC Zen 4, docs/performance.md). The
    values are the same; the gradients of the uses then sum in bf16 before their one cast
    back, as a reused weight's do under autocast's cast cache."""
    device = x.device.type
    return x.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else x
