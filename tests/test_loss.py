"""The hand-written label-smoothed cross-entropy equals torch's, in value and gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nmt.loss import smoothed_cross_entropy


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_matches_torch_cross_entropy(smoothing):
    torch.manual_seed(0)
    logits = torch.randn(12, 50, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 50, (12,))
    target[[2, 7]] = 0  # padding rows are ignored
    ours, count = smoothed_cross_entropy(logits, target, smoothing, 0)
    theirs = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=smoothing)
    torch.testing.assert_close(ours, theirs)
    assert count.item() == 10
    (grad_ours,) = torch.autograd.grad(ours, logits)
    (grad_theirs,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(grad_ours, grad_theirs)
    assert torch.all(grad_ours[[2, 7]] == 0)


def test_bfloat16_logits_get_bfloat16_gradients():
    logits = torch.randn(4, 10).bfloat16().requires_grad_()
    loss, _ = smoothed_cross_entropy(logits, torch.tensor([1, 2, 3, 0]), 0.1, 0)
    loss.backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
