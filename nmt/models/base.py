"""The decoding interface both model families offer, and the one helper search needs.

A model offers
    forward(src, src_mask, tgt_in) -> logits (B, T, V)           teacher-forced training
    encode(src, src_mask) -> memory                               once per batch
    init_state(memory) -> state                                   before the first step
    decode_step(prev (B,), state, memory, need_attn) -> (log_probs (B, V), state, attn | None)
where attn is the source attention of this step, (B, ..., S): (B, S) for the RNN,
(B, L, H, S) per layer and head for the Transformer.
``memory`` and ``state`` are nests of tensors (tuples, lists, dicts) whose tensors all have
the batch on dim 0, or leaves with their own ``index_select(0, index)``, so ``select_rows``
can reorder them for beam search or drop finished sentences without knowing the family.

``memory`` holds one row per sentence, while ``prev`` and ``state`` may hold K rows per
sentence (the beams; row i * K + j is beam j of sentence i). The model attends with a
sentence's K beams as K query positions over its one memory row (``beams_as_queries``), so
beam search never copies the memory K times and the K queries share one batched matmul.
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
    """Apply ``index_select(0, index)`` to every tensor in a nest, and to any other leaf that
    offers it (the Transformer's ``SelfAttentionCache``); other leaves pass through."""
    if hasattr(nest, "index_select"):  # a tensor, or a leaf that reorders itself
        return nest.index_select(0, index)
    if isinstance(nest, dict):
        return {key: select_rows(value, index) for key, value in nest.items()}
    if isinstance(nest, (list, tuple)):
        return type(nest)(select_rows(value, index) for value in nest)
    return nest


def beams_as_queries(queries: Tensor, sentences: int) -> Tensor:
    """(n * K, T, D) -> (n, K * T, D): each sentence's K beams (rows i * K + j) become K * T
    query positions over the sentence's one memory row. Reshape the result back with the
    queries' shape."""
    return queries.reshape(sentences, -1, queries.size(-1))
