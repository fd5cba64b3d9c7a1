"""Word alignments from cross-attention (nmt.alignment): words as the text splits them, a
word's pieces' weights summed on both sides, the EOS row and column left out."""

import pytest
import torch

from nmt.alignment import aligned, pharaoh, word_alignment, word_ids, words_of_spans
from nmt.data.tokenizer import train_tokenizer
from nmt.translator import Translation


def test_pieces_are_grouped_into_the_texts_words():
    assert word_ids(["▁Ein", "▁Hund", "e", "▁läuft"]).tolist() == [0, 1, 1, 2]
    assert word_ids(["a", "▁b"]).tolist() == [0, 1]  # no "▁" on the first piece: word 0 still
    # a bare "▁" is SentencePiece's space before a piece it did not merge with: " (" is one word
    assert word_ids(["▁a", "▁", "(", "▁b"]).tolist() == [0, 0, 1, 2]
    assert word_ids(["▁", "(", "▁x"]).tolist() == [0, 0, 1]
    assert word_ids(["▁a", "▁"]).tolist() == [0, 0]  # "a " is one word


def test_each_target_word_takes_the_source_word_its_pieces_weigh_most():
    source = ["▁Ein", "▁Hund", "e", "▁läuft"]  # words: Ein, Hunde, läuft (+ EOS column)
    target = ["▁A", "▁dog", "▁run", "s"]  # words: A, dog, runs (+ EOS row)
    weights = torch.tensor([
        [0.50, 0.20, 0.10, 0.10, 0.10],  # A -> Ein
        [0.10, 0.25, 0.25, 0.40, 0.00],  # dog: "läuft" is its heaviest piece, "Hunde" its heaviest word
        [0.10, 0.10, 0.00, 0.30, 0.50],  # run: the EOS column (0.50) is no word
        [0.00, 0.55, 0.00, 0.45, 0.00],  # s alone would take "Hunde"; "runs" as a word, "läuft"
        [0.90, 0.00, 0.00, 0.00, 0.10],  # EOS row: no word
    ])
    pairs = word_alignment(weights, word_ids(source), word_ids(target))
    assert pairs == [(0, 0), (1, 1), (2, 2)]
    assert pharaoh(pairs) == "0-0 1-1 2-2"


def test_an_empty_translation_or_source_has_no_pairs():
    assert word_alignment(torch.ones(1, 3), word_ids(["▁a", "▁b"]), word_ids([])) == []
    assert word_alignment(torch.ones(2, 1), word_ids([]), word_ids(["▁a"])) == []


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = ["Ein Hund läuft durch den Park.", "Das ist Peters Hund.", "Zwei Männer spielen."] * 30
    return train_tokenizer(texts, tmp_path_factory.mktemp("spm") / "spm.model", 60)


def test_a_transformers_alignment_reads_the_chosen_layer_and_head(tokenizer):
    """--alignment reads the last layer's mean over heads unless --attention-layer and
    --attention-head choose another (which layer aligns best varies by model)."""
    crossed, straight = torch.tensor([[0.1, 0.9], [0.9, 0.1]]), torch.eye(2)
    attention = torch.zeros(3, 2, 2, 3)  # (T + 1, layers, heads, S + 1): A, dog, EOS over Ein, Hund, EOS
    attention[:2, 0, 0, :2], attention[:2, 0, 1, :2] = crossed, straight  # layer 0: heads disagree
    attention[:2, 1, 0, :2] = attention[:2, 1, 1, :2] = crossed  # layer 1, the last: crossed
    translation = Translation("A dog", 0.0, ["▁A", "▁dog"], attention, ["▁Ein", "▁Hund", "</s>"])
    line = "Ein Hund"

    def pairs(*choice):
        return aligned(translation, line, tokenizer, *choice)

    assert pairs() == "1-0 0-1"  # the last layer's mean
    assert pairs(0, "1") == pairs(0) == "0-0 1-1"
    assert pairs(0, "0") == pairs(-1, "mean") == "1-0 0-1"


@pytest.mark.parametrize("text, pieces, spans, words", [
    # nmt_nfkc cuts "´" as a space and an accent: SentencePiece's marks made "s" a fifth word
    ("Das ist Peter´s Hund.", ["▁Das", "▁ist", "▁Pe", "ter", "▁", "\u0301", "s", "▁Hund", "."],
     [(0, 3), (3, 7), (7, 10), (10, 13), (13, 13), (13, 14), (14, 15), (15, 20), (20, 21)],
     [0, 1, 2, 2, 2, 2, 2, 3, 3]),
    # "½" becomes "1⁄2": its first piece spans the space before it, its second none
    ("Straße ½ km", ["▁Straße", "▁1", "\u2044", "2", "▁k", "m"],
     [(0, 6), (6, 7), (7, 7), (7, 8), (8, 10), (10, 11)], [0, 1, 1, 1, 2, 2]),
    # spaces before, between and inside; a bare "▁" goes with the word after it
    ("  Zwei  Männer ( im Park )", ["▁Zwei", "▁Männer", "▁(", "▁im", "▁Park", "▁", ")"],
     [(2, 6), (6, 14), (14, 16), (16, 19), (19, 24), (24, 25), (25, 26)], [0, 1, 2, 3, 4, 5, 5]),
])
def test_pieces_go_to_the_whitespace_word_they_were_cut_from(text, pieces, spans, words):
    """SentencePiece's offsets (as its offset mapping gives them for these texts) place each
    piece in a word of the text as str.split() numbers them, wherever normalisation moved a
    word break."""
    assert words_of_spans(text, spans, pieces).tolist() == words
    assert max(words) == len(text.split()) - 1


def test_alignment_numbers_the_words_of_the_source_line_and_the_translation(tokenizer):
    """The pairs index the source line's and the translation's words split at whitespace: a
    source word with "´" in it (cut into more "▁" pieces) or two words joined by a zero-width
    space (cut as two) gave indices past the line's last word, and an unknown target piece
    (decoded as " ⁇ ") a word the pairs left out."""
    if tokenizer.spans("x") is None:
        pytest.skip("this SentencePiece has no offset mapping (0.2.3 and later)")
    for line in ("Das ist Peter´s Hund.", "Ein\u200bHund läuft."):
        source = tokenizer.pieces(tokenizer.encode([line])[0])
        unknown = tokenizer.sp.id_to_piece(tokenizer.sp.unk_id())
        target = [*tokenizer.pieces(tokenizer.encode(["Ein Hund"])[0]), unknown]
        text = tokenizer.sp.decode_pieces(target)
        assert text.split() == ["Ein", "Hund", "\u2047"]
        weights = torch.zeros(len(target) + 1, len(source) + 1)
        weights[:, len(source) - 1] = 1.0  # every target word looks at the last source piece
        translation = Translation(text, 0.0, target, weights, [*source, "</s>"])
        # the pieces' marks alone: not the texts' words
        by_marks = pharaoh(word_alignment(weights, word_ids(source), word_ids(target)))
        pairs = aligned(translation, line, tokenizer)
        last = len(line.split()) - 1
        assert pairs == f"{last}-0 {last}-1 {last}-2"
        assert by_marks != pairs
