"""The decoding interface both model families offer, and the one helper search needs.

A model offers
    forward(src, src_mask, tgt_in) -> logits (B, T, V)           teacher-forced training
    encode(src, src_mask) -> memory                               once per batch
    init_state(memory) -> state                                   before the first step
    decode_step(prev (B,), state, memory, need_attn) -> (log_probs (B, V), state, attn | None)
where attn is the source attention of this step, (B, ..., S): (B, S) for the RNN,
(B, L, H, S) per layer and head for the Transformer.
``memory`` and ``state`` are nests of tensors (tuples, lists, dicts) whose tensors all have
the batch on dim 0, so ``select_rows`` can reorder them for beam search or drop finished
sentences without knowing the family.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class Seq2Seq(Protocol):
    max_positions: int

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor: ...

    def encode(self, src: Tensor, src_mask: Tensor) -> Any: ...

    def init_state(self, memory: Any) -> Any: ...

    def decode_step(
        self, prev: Tensor, state: Any, memory: Any, need_attn: bool = False
    ) -> tuple[Tensor, Any, Tensor | None]: ...


def select_rows(nest: Any, index: Tensor) -> Any:
    """Apply ``index_select(0, index)`` to every tensor in a nest; other leaves pass through."""
    if isinstance(nest, Tensor):
        return nest.index_select(0, index)
    if isinstance(nest, dict):
        return {key: select_rows(value, index) for key, value in nest.items()}
    if isinstance(nest, (list, tuple)):
        return type(nest)(select_rows(value, index) for value in nest)
    return nest
