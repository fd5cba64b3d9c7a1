"""Word alignments read off cross-attention: ``nmt translate --alignment``.

Each target word is aligned to the source word its attention weighs most, the way fairseq's
``--print-alignment`` and Marian's ``--alignment hard`` read them (for a Transformer, by
default the last decoder layer's weights averaged over its heads, as those tools take them, and
CTranslate2 gives them; ``--attention-layer`` and ``--attention-head`` choose another map).
Words are SentencePiece's: a piece that starts with "▁" starts a word, so the words are the
text's, split at whitespace. With pieces ``p`` of word ``w``:

    mass[t, w] = sum over source pieces p of word w of weights[t, p]   (all its pieces' weight)
    votes[v, w] = sum over target pieces t of word v of mass[t, w]      (each piece votes)
    target word v is aligned to source word argmax_w votes[v, w]

The pairs are written as ``i-j`` (source word i, target word j, from 0), the Pharaoh format
of fast_align and Moses, in target order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from nmt.attention_stats import attention_matrix

if TYPE_CHECKING:
    from nmt.translator import Translation

WORD_START = "\u2581"  # SentencePiece's "▁"


def word_ids(pieces: list[str]) -> Tensor:
    """(P,) the word each piece belongs to, counting from 0, so that the words are the
    decoded text's split at whitespace: a piece starting with "▁" starts the next word; a bare
    "▁" (SentencePiece's space before a piece it does not merge with, "▁" "(") leaves the
    start to the piece after it, and belongs to the word before (or, first, to word 0)."""
    starts = [(piece.startswith(WORD_START) and piece != WORD_START)
              or (i > 0 and pieces[i - 1] == WORD_START) or (i == 0 and piece != WORD_START)
              for i, piece in enumerate(pieces)]
    return (torch.tensor(starts, dtype=torch.long).cumsum(0) - 1).clamp(min=0)


def word_alignment(weights: Tensor, source: list[str], target: list[str]) -> list[tuple[int, int]]:
    """(source word, target word) pairs, one per target word. ``weights`` (T + 1, S + 1): the
    cross-attention of the ``target`` pieces and their EOS (rows) over the ``source`` pieces
    and their EOS (columns); the EOS row and column are left out."""
    if not target or not source:
        return []
    # on the CPU, where the word indices are made: a decoding on CUDA keeps its weights there
    weights = weights[: len(target), : len(source)].float().cpu()  # (T, S)
    src_words, tgt_words = word_ids(source), word_ids(target)  # (S,), (T,)
    mass = weights.new_zeros(len(target), int(src_words[-1]) + 1).index_add_(1, src_words, weights)
    votes = mass.new_zeros(int(tgt_words[-1]) + 1, mass.size(1)).index_add_(0, tgt_words, mass)
    best = votes.argmax(1)  # (Wt,) the source word of each target word
    return [(int(i), j) for j, i in enumerate(best)]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """``0-0 1-2 ...``: source-target word pairs as fast_align and Moses write them."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def aligned(translation: Translation, layer: int = -1, head: str = "mean") -> str:
    """The Pharaoh pairs of a translation decoded with its attention, as ``translate
    --alignment`` and ``serve``'s ``"alignment"`` give them: from its cross-attention, for a
    Transformer ``layer``'s mean over heads or one head (``head``: "mean" or a head number, as
    ``--attention-head`` takes it); "" for an empty line."""
    if translation.attention is None:
        return ""
    one_head = None if head == "mean" else int(head)
    # in fp32 before the mean over heads: bf16 weights could round a near tie the other way
    weights = attention_matrix(translation.attention.float(), layer, one_head)  # (T + 1, S + 1)
    return pharaoh(word_alignment(weights, translation.source[:-1], translation.pieces))
