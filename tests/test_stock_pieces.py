"""The benchmarks' stock loop (scripts/stock_pieces.py) trains the same model: PyTorch's
dropout, fused attention and tanh in place of the model's own pieces, the same function."""

from __future__ import annotations

import random
from contextlib import ExitStack
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from nmt.attention import AdditiveScorer
from tests.conftest import REPO, reversal_batch, tiny_model


@pytest.fixture
def stock(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    from stock_pieces import use_stock_pieces

    return use_stock_pieces


@pytest.mark.parametrize("family,attention", [("transformer", "scaled_dot"), ("rnn", "additive")])
def test_stock_pieces_compute_the_same_function(stock, family, attention):
    batch = reversal_batch(random.Random(0), 6)
    model = tiny_model(family, attention).eval()
    with torch.no_grad():
        own = model(batch.src, batch.src_mask, batch.tgt_in)
        with ExitStack() as patches:
            stock(patches)
            assert AdditiveScorer.score.__name__ == "tanh_score"  # the swap is in place
            assert AdditiveScorer.prepare_keys.__name__ == "plain_keys"
            stock_logits = model(batch.src, batch.src_mask, batch.tgt_in)
    assert AdditiveScorer.score.__name__ == "score"  # and undone with the stack
    torch.testing.assert_close(stock_logits, own, atol=1e-5, rtol=1e-5)


def test_stock_pieces_call_pytorchs_kernels(stock):
    """In training, the Transformer's attention goes through the fused kernel and its
    dropout through F.dropout; without the patches, through neither."""
    batch = reversal_batch(random.Random(0), 6)
    model = tiny_model("transformer", "scaled_dot", dropout=0.1).train()
    counts = {}
    for name in ("own", "stock"):
        with ExitStack() as patches:
            if name == "stock":
                stock(patches)
            sdpa = patches.enter_context(mock.patch.object(
                F, "scaled_dot_product_attention", wraps=F.scaled_dot_product_attention))
            drop = patches.enter_context(mock.patch.object(F, "dropout", wraps=F.dropout))
            model(batch.src, batch.src_mask, batch.tgt_in).sum().backward()
            counts[name] = sdpa.call_count, drop.call_count
    assert counts["own"] == (0, 0)
    assert counts["stock"][0] > 0 and counts["stock"][1] > 0
