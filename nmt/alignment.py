"""Word alignments read off cross-attention: ``nmt translate --alignment``.

Each target word is aligned to the source word its attention weighs most, the way fairseq's
``--print-alignment`` and Marian's ``--alignment hard`` read them (for a Transformer, by
default the last decoder layer's weights averaged over its heads, as those tools take them, and
CTranslate2 gives them; ``--attention-layer`` and ``--attention-head`` choose another map).
Words are the texts' split at whitespace (``str.split``): each piece belongs to the word of the
text it was cut from (SentencePiece's offsets; normalisation can move word breaks: "Peter´s" is
cut as "▁Pe ter ▁ ́ s", and "Ein<zero-width space>Hund" as two words). With pieces ``p`` of word
``w``:

    mass[t, w] = sum over source pieces p of word w of weights[t, p]   (all its pieces' weight)
    votes[v, w] = sum over target pieces t of word v of mass[t, w]      (each piece votes)
    target word v is aligned to source word argmax_w votes[v, w]

The pairs are written as ``i-j`` (source word i, target word j, from 0), the Pharaoh format
of fast_align and Moses, in target order.
"""

from __future__ import annotations

import bisect
import re
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from nmt.attention_stats import attention_matrix

if TYPE_CHECKING:
    from nmt.data.tokenizer import Tokenizer
    from nmt.translator import Translation

WORD_START = "\u2581"  # SentencePiece's "▁"
WORD = re.compile(r"\S+")  # a word: what str.split() splits a text into


def words_of_spans(text: str, spans: list[tuple[int, int]], pieces: list[str]) -> Tensor:
    """(P,) the word of ``text`` (counting from 0) each piece belongs to, from its (begin,
    end) characters in ``text``: the word of its first character that is not whitespace; for
    a piece with none (a bare "▁", a piece normalisation added), the word it lies in or the
    next (for one that starts with "▁", the word after it). Never past the last word."""
    ends = [word.end() for word in WORD.finditer(text)]  # each word's end, in order
    ids = []
    for (begin, end), piece in zip(spans, pieces):
        first = next((i for i in range(begin, end) if not text[i].isspace()),
                     end if piece.startswith(WORD_START) else begin)
        ids.append(min(bisect.bisect_right(ends, first), len(ends) - 1))  # words ended before it
    return torch.tensor(ids, dtype=torch.long)


def text_word_ids(text: str, pieces: list[str],
                  cut: tuple[list[str], list[tuple[int, int]]] | None) -> Tensor:
    """(P,) the whitespace word of ``text`` each of its ``pieces`` belongs to, by ``cut``: the
    pieces ``text`` was cut into, each with its span (``Tokenizer.spans``, ``decoded_spans``).
    Where there is none (an older SentencePiece), or ``pieces`` are not its first (cut from
    another text), by the pieces' "▁" marks (``word_ids``)."""
    if cut is None or cut[0][: len(pieces)] != pieces or not text.split():
        return word_ids(pieces)
    return words_of_spans(text, cut[1], pieces)


def word_ids(pieces: list[str]) -> Tensor:
    """(P,) the word each piece belongs to, counting from 0, by SentencePiece's marks: the
    decoded text's words, split at whitespace, where normalisation moved no word break (see
    ``words_of_spans``): a piece starting with "▁" starts the next word; a bare
    "▁" (SentencePiece's space before a piece it does not merge with, "▁" "(") leaves the
    start to the piece after it, and belongs to the word before (or, first, to word 0)."""
    starts = [(piece.startswith(WORD_START) and piece != WORD_START)
              or (i > 0 and pieces[i - 1] == WORD_START) or (i == 0 and piece != WORD_START)
              for i, piece in enumerate(pieces)]
    return (torch.tensor(starts, dtype=torch.long).cumsum(0) - 1).clamp(min=0)


def word_alignment(weights: Tensor, src_words: Tensor, tgt_words: Tensor) -> list[tuple[int, int]]:
    """(source word, target word) pairs, one per target word. ``weights`` (T + 1, S + 1): the
    cross-attention of the T target pieces and their EOS (rows) over the S source pieces and
    their EOS (columns); the EOS row and column are left out. ``src_words`` (S,) and
    ``tgt_words`` (T,): each piece's word."""
    if not len(tgt_words) or not len(src_words):
        return []
    # on the CPU, where the word indices are made: a decoding on CUDA keeps its weights there
    weights = weights[: len(tgt_words), : len(src_words)].float().cpu()  # (T, S)
    mass = weights.new_zeros(len(tgt_words), int(src_words.max()) + 1).index_add_(1, src_words, weights)
    votes = mass.new_zeros(int(tgt_words.max()) + 1, mass.size(1)).index_add_(0, tgt_words, mass)
    best = votes.argmax(1)  # (Wt,) the source word of each target word
    return [(int(i), j) for j, i in enumerate(best)]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """``0-0 1-2 ...``: source-target word pairs as fast_align and Moses write them."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def aligned(translation: Translation, line: str, tokenizer: Tokenizer, layer: int = -1,
            head: str = "mean") -> str:
    """The Pharaoh pairs of a translation of ``line`` decoded with its attention, as
    ``translate --alignment`` and ``serve``'s ``"alignment"`` give them: from its
    cross-attention, for a Transformer ``layer``'s mean over heads or one head (``head``:
    "mean" or a head number, as ``--attention-head`` takes it); "" for an empty line. Words
    are the whitespace words of ``line`` and of the translation's text (``text_word_ids``, by
    the ``tokenizer``'s spans)."""
    if translation.attention is None:
        return ""
    one_head = None if head == "mean" else int(head)
    # in fp32 before the mean over heads: bf16 weights could round a near tie the other way
    weights = attention_matrix(translation.attention.float(), layer, one_head)  # (T + 1, S + 1)
    source, target, text = translation.source[:-1], translation.pieces, translation.text
    return pharaoh(word_alignment(weights, text_word_ids(line, source, tokenizer.spans(line)),
                                  text_word_ids(text, target, tokenizer.decoded_spans(target, text))))
