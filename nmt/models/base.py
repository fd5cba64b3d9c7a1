"""The decoding interface both model families offer, and the one helper search needs.

A model offers
    forward(src, src_mask, tgt_in) -> logits (B, T, V)           teacher-forced training
    encode(src, src_mask) -> memory                               once per batch
    init_state(memory) -> state                                   before the first step
    decode_step(prev (B,), state, memory, need_attn, beams) -> (log_probs (B, V), state, attn | None)
    set_dropout(p)                                                training: ``dropout`` from now on
where attn is the source attention of this step, (B, ..., S): (B, S) for the RNN,
(B, L, H, S) per layer and head for the Transformer.
``memory`` and ``state`` are nests of tensors (tuples, lists, dicts) whose tensors all have
the batch on dim 0, or leaves with their own ``index_select(0, index)``, so ``select_rows``
can reorder them for beam search or drop finished sentences without knowing the family.

``memory`` holds one row per sentence, while ``prev`` and ``state`` may hold K rows per
sentence (the beams; row i * K + j is beam j of sentence i). The model attends with a
sentence's K beams as K query positions over its one memory row (``beams_as_queries``), so
beam search never copies the memory K times and the K queries share one batched matmul.
When beam search has pruned some hypotheses, the rows are only those of the live ones, and
``beams`` (a ``Beams``) says which of the n * K beam slots each row fills; the model pads
the queries to all slots where it attends (``beams_as_queries``) and takes its rows back
(``beam_rows``). ``beams=None``: every slot has its row, B = n * K.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor, nn


def model_option(cls: type[nn.Module], options: dict[str, Any], name: str) -> Any:
    """The value of the family's constructor argument ``name``: given, or its default."""
    return options.get(name, inspect.signature(cls).parameters[name].default)


@dataclass(frozen=True)
class Beams:
    """The decoding batch's rows when beam search dropped some: row r is beam slot
    ``slots[r]`` of the n * ``width`` slots (slot i * width + j: beam j of sentence i)."""

    width: int  # K, slots per sentence
    slots: Tensor  # (B,) increasing slot numbers


class Seq2Seq(Protocol):
    max_positions: int

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor: ...

    def encode(self, src: Tensor, src_mask: Tensor) -> Any: ...

    def init_state(self, memory: Any) -> Any: ...

    def decode_step(
        self, prev: Tensor, state: Any, memory: Any, need_attn: bool = False,
        beams: Beams | None = None,
    ) -> tuple[Tensor, Any, Tensor | None]: ...

    def set_dropout(self, p: float) -> None: ...


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


def beams_as_queries(queries: Tensor, sentences: int, beams: Beams | None = None) -> Tensor:
    """(B, T, D) -> (n, K * T, D): each sentence's K beams (slots i * K + j) become K * T
    query positions over the sentence's one memory row; slots without a row (pruned beams)
    get zero queries. Reshape the result to (n * K, T, ...) and pass it to ``beam_rows``."""
    if beams is not None:
        padded = queries.new_zeros((sentences * beams.width, *queries.shape[1:]))
        queries = padded.index_copy_(0, beams.slots, queries)
    return queries.reshape(sentences, -1, queries.size(-1))


def beam_rows(per_slot: Tensor, beams: Beams | None = None) -> Tensor:
    """(n * K, ...) results of the padded queries -> (B, ...), the batch rows' own."""
    return per_slot if beams is None else per_slot.index_select(0, beams.slots)
