"""nmt.loss: blockwise label-smoothed cross-entropy, against torch's on an fp32 copy."""

import pytest
import torch
import torch.nn.functional as F

import nmt.loss
from nmt.loss import smoothed_cross_entropy

PAD = 0


def loss_and_grad(loss_fn, logits: torch.Tensor, target: torch.Tensor, eps: float,
                  scale: float = 2.5):
    x = logits.detach().clone().requires_grad_()  # clone keeps a non-contiguous layout
    loss = loss_fn(x, target, eps)
    (scale * loss).backward()  # a grad_output other than 1 must scale the gradient
    return loss.detach(), x.grad


def reference(x, target, eps):
    return F.cross_entropy(x.float(), target, ignore_index=PAD, label_smoothing=eps)


def ours(x, target, eps):
    return smoothed_cross_entropy(x, target, eps, PAD)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("block_elements", [7, 100, 2**19])  # a block of 1 row, ragged, all rows
@pytest.mark.parametrize("scale", [1.0, 2.5])  # 1: backward hands the forward's gradient on
def test_value_and_gradient_match_torch_with_ignored_rows(monkeypatch, eps, block_elements, scale):
    monkeypatch.setattr(nmt.loss, "CHUNK_ELEMENTS", block_elements)
    torch.manual_seed(0)
    logits = 3 * torch.randn(37, 11)
    target = torch.randint(1, 11, (37,))
    target[[0, 5, 36]] = PAD
    expected, expected_grad = loss_and_grad(reference, logits, target, eps, scale)
    loss, grad = loss_and_grad(ours, logits, target, eps, scale)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-7)
    assert grad[[0, 5, 36]].abs().max() == 0  # ignored rows get no gradient


def test_bf16_logits_get_an_fp32_loss_and_a_bf16_gradient_like_an_fp32_copy():
    torch.manual_seed(1)
    logits = (4 * torch.randn(50, 300)).bfloat16()
    target = torch.randint(0, 300, (50,))
    expected, expected_grad = loss_and_grad(reference, logits, target, 0.1)
    loss, grad = loss_and_grad(ours, logits, target, 0.1)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(grad.float(), expected_grad.float(), rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("ignore_index", [3, -100])  # an index inside the vocabulary, or not
def test_any_ignore_index_and_non_contiguous_logits(ignore_index):
    torch.manual_seed(2)
    logits = torch.randn(9, 120).t()  # (120, 9), column-major
    assert not logits.is_contiguous()
    target = torch.randint(0, 9, (120,))
    target[::7] = ignore_index

    def torch_loss(x, t, eps):
        return F.cross_entropy(x, t, ignore_index=ignore_index, label_smoothing=eps)

    def our_loss(x, t, eps):
        return smoothed_cross_entropy(x, t, eps, ignore_index)

    expected, expected_grad = loss_and_grad(torch_loss, logits, target, 0.2)
    loss, grad = loss_and_grad(our_loss, logits, target, 0.2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(grad, expected_grad, atol=1e-7)


def test_under_autocast_and_no_grad_the_loss_is_the_same_fp32_value():
    torch.manual_seed(3)
    logits = torch.randn(40, 50)
    target = torch.randint(0, 50, (40,))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = smoothed_cross_entropy(logits, target, 0.1, PAD)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(reference(logits, target, 0.1).item(), rel=1e-6)


def test_every_row_ignored_gives_zero_not_nan():
    logits = torch.randn(4, 9, requires_grad=True)
    loss = smoothed_cross_entropy(logits, torch.full((4,), PAD), 0.1, PAD)
    loss.backward()
    assert loss.item() == 0.0 and logits.grad.abs().max() == 0


def test_the_saved_gradient_survives_a_unit_backward_and_a_second_one():
    """Backward hands out the gradient taken in forward when the incoming gradient is 1: a
    retained graph's second backward, scaled, must still see it unchanged."""
    torch.manual_seed(4)
    logits = torch.randn(30, 12, requires_grad=True)
    target = torch.randint(1, 12, (30,))
    expected, expected_grad = loss_and_grad(reference, logits.detach(), target, 0.1)
    loss = ours(logits, target, 0.1)
    (unit,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (scaled,) = torch.autograd.grad(2.5 * loss, logits)
    assert torch.allclose(unit * 2.5, expected_grad, atol=1e-7)
    assert torch.allclose(scaled, expected_grad, atol=1e-7)


def test_fp16_logits_under_a_loss_scale_keep_their_small_gradients():
    """With 16-mixed, the gradient scaler's factor arrives in backward: a gradient stored in
    fp16 before it would flush most entries (p / tokens) to zero."""
    torch.manual_seed(5)
    logits = (3 * torch.randn(512, 4000)).half()
    target = torch.randint(1, 4000, (512,))
    _, expected_grad = loss_and_grad(reference, logits, target, 0.1, scale=65536.0)
    _, grad = loss_and_grad(ours, logits, target, 0.1, scale=65536.0)
    assert grad.dtype == torch.float16
    assert (grad == 0).float().mean() <= (expected_grad == 0).float().mean() + 1e-4
    assert torch.allclose(grad.float(), expected_grad.float(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_confidently_wrong_rows_keep_their_exact_large_loss(dtype):
    """The log-sum-exp comes from the softmax's largest value: with logits hundreds apart,
    where most probabilities underflow to 0, the loss of a target far below the row's maximum
    must still be its exact (large) value, not inf or a clipped one."""
    torch.manual_seed(6)
    logits = (300 * torch.randn(16, 50)).to(dtype)
    target = logits.float().argmin(-1)  # the least likely token of each row
    expected, expected_grad = loss_and_grad(reference, logits, target, 0.1)
    loss, grad = loss_and_grad(ours, logits, target, 0.1)
    assert expected.item() > 500
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert torch.allclose(grad.float(), expected_grad.float(), rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_masked_tokens_and_a_large_shared_offset_match_torch(eps):
    """-inf logits (tokens masked out) must not turn the loss into NaN (torch: finite without
    smoothing, inf with it, the smoothing's mass on masked tokens), and logits far from 0 (a
    shared offset of 1,000, or of 1e34) must give torch's value: the loss does not change when
    a row is shifted, so its terms must not cancel at the logits' magnitude."""
    torch.manual_seed(7)
    base = 3 * torch.randn(24, 400)
    target = torch.randint(1, 200, (24,))
    masked = base.clone()
    masked[:, 200:] = float("-inf")  # never a target
    huge = 1e34 * (1 + 0.01 * torch.randn(24, 400))
    for logits in (masked, base + 1000, huge):
        expected, expected_grad = loss_and_grad(reference, logits, target, eps)
        loss, grad = loss_and_grad(ours, logits, target, eps)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)  # inf == inf
        assert torch.allclose(grad, expected_grad, atol=1e-6)
