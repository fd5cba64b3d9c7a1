"""nmt.dropout: inverted dropout with a cheaper CPU mask, as a drop-in for torch's."""

import pytest
import torch

from nmt.dropout import LEVELS, Dropout, dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drops_at_rate_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = dropout(x, p, training=True)
    kept = y != 0
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=0.003)
    assert torch.unique(y[kept]).tolist() == [pytest.approx(LEVELS / (LEVELS - round(p * LEVELS)))]
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)


def test_each_of_the_four_uniforms_cut_from_64_bits_is_unbiased():
    # torch's random_() leaves an int64's sign bit 0; a mask cut from such words would keep
    # every fourth element far more often than the others.
    torch.manual_seed(1)
    kept = dropout(torch.ones(4 * 100_000), 0.5, training=True).view(-1, 4) != 0
    for position in range(4):
        assert kept[:, position].float().mean().item() == pytest.approx(0.5, abs=0.01)


def test_gradient_flows_only_through_kept_elements_with_their_scale():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.2, training=True)
    y.sum().backward()
    scale = LEVELS / (LEVELS - round(0.2 * LEVELS))
    assert torch.equal(x.grad != 0, y != 0)
    assert torch.allclose(x.grad[y != 0], torch.full_like(x.grad[y != 0], scale))


def test_same_seed_same_mask_and_bf16_keeps_its_dtype():
    x = torch.randn(10, 7, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = dropout(x, 0.3, training=True)
    torch.manual_seed(3)
    b = dropout(x, 0.3, training=True)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)


def test_identity_when_not_training_or_p_zero_and_zeros_at_p_one():
    x = torch.randn(5, 6)
    layer = Dropout(0.3).eval()
    assert torch.equal(layer(x), x)
    assert torch.equal(dropout(x, 0.0, training=True), x)
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))
