"""Word alignments from cross-attention (nmt.alignment): words as the text splits them, a
word's pieces' weights summed on both sides, the EOS row and column left out."""

import torch

from nmt.alignment import pharaoh, word_alignment, word_ids


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
    pairs = word_alignment(weights, source, target)
    assert pairs == [(0, 0), (1, 1), (2, 2)]
    assert pharaoh(pairs) == "0-0 1-1 2-2"


def test_an_empty_translation_or_source_has_no_pairs():
    assert word_alignment(torch.ones(1, 3), ["▁a", "▁b"], []) == []
    assert word_alignment(torch.ones(2, 1), [], ["▁a"]) == []


def test_a_transformers_alignment_reads_the_chosen_layer_and_head():
    """--alignment reads the last layer's mean over heads unless --attention-layer and
    --attention-head choose another (which layer aligns best varies by model)."""
    from nmt.alignment import aligned
    from nmt.translator import Translation

    crossed, straight = torch.tensor([[0.1, 0.9], [0.9, 0.1]]), torch.eye(2)
    attention = torch.zeros(3, 2, 2, 3)  # (T + 1, layers, heads, S + 1): A, dog, EOS over Ein, Hund, EOS
    attention[:2, 0, 0, :2], attention[:2, 0, 1, :2] = crossed, straight  # layer 0: heads disagree
    attention[:2, 1, 0, :2] = attention[:2, 1, 1, :2] = crossed  # layer 1, the last: crossed
    translation = Translation("A dog", 0.0, ["▁A", "▁dog"], attention, ["▁Ein", "▁Hund", "</s>"])
    assert aligned(translation) == "1-0 0-1"  # the last layer's mean
    assert aligned(translation, 0, "1") == aligned(translation, 0) == "0-0 1-1"
    assert aligned(translation, 0, "0") == aligned(translation, -1, "mean") == "1-0 0-1"
