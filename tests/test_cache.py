"""The Transformer's self-attention cache: a reorder is recorded and applied by the next
step's one copy, with the result of reordering (B, H, T, Dh) tensors and concatenating."""

import torch

from nmt.models.base import select_rows
from nmt.models.cache import SelfAttentionCache, batch_major


def _step(cache: SelfAttentionCache, new: list[tuple[torch.Tensor, torch.Tensor]]) -> SelfAttentionCache:
    return SelfAttentionCache(tuple(cache.extend(i, k, v) for i, (k, v) in enumerate(new)))


def _new_position(batch: int, layers: int = 2, heads: int = 3, dim: int = 4):
    return [(torch.randn(batch, heads, 1, dim), torch.randn(batch, heads, 1, dim)) for _ in range(layers)]


def test_reordered_cache_equals_reordering_and_concatenating_batch_major_tensors():
    torch.manual_seed(0)
    cache, reference = SelfAttentionCache(), None  # reference: per layer (B, H, T, Dh) pairs
    for index in (None, torch.tensor([2, 2, 0, 1]), torch.tensor([3, 1]), torch.tensor([0, 0, 1])):
        if index is not None:  # beam search's reorder: repeats, drops, permutes rows
            cache = select_rows({"cache": cache}, index)["cache"]
            reference = select_rows(reference, index)
        new = _new_position(4 if reference is None else len(index))
        cache = _step(cache, new)
        reference = new if reference is None else [
            (torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(reference, new)]
        assert cache.length == reference[0][0].size(2)
        for (k, v), (rk, rv) in zip(cache.layers, reference):
            assert torch.equal(batch_major(k), rk) and torch.equal(batch_major(v), rv)


def test_a_reorder_copies_nothing_and_composes():
    cache = _step(SelfAttentionCache(), _new_position(5))
    stored = cache.layers[0][0]
    picked = cache.index_select(0, torch.tensor([4, 3, 1])).index_select(0, torch.tensor([2, 0]))
    assert picked.layers[0][0] is stored  # nothing copied yet
    assert picked.order.tolist() == [1, 4]
