"""Data path: corpus loading (local layout, named files, Hub failure), joint SentencePiece,
cached ids, and the token-budget sampler."""

from __future__ import annotations

import gzip

import pytest

from nmt.config import DataConfig
from nmt.data.batching import PairDataset, TokenBatchSampler, collate
from nmt.data.corpus import load_corpus
from nmt.data.module import prepare_data, split_dataset
from nmt.data.tokenizer import BOS, EOS, PAD, tokenizer_path
from nmt.errors import NMTError

from .conftest import MULTI30K, write_corpus


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="data/multi30k not linked")
@pytest.mark.parametrize("src,tgt", [("de", "en"), ("en", "fr"), ("cs", "en")])
def test_local_multi30k_layout(src, tgt):
    corpus = load_corpus(DataConfig(data_dir=str(MULTI30K.parent), src_lang=src, tgt_lang=tgt))
    assert {k: len(v) for k, v in corpus.items()} == {"train": 29000, "val": 1014, "test": 1000}
    with gzip.open(MULTI30K / f"val.{src}.gz", "rt", encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    assert corpus["val"][0]["src"] == first


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="data/multi30k not linked")
def test_train_lines_cuts_training_split():
    cfg = DataConfig(data_dir=str(MULTI30K.parent), train_lines=123)
    assert len(load_corpus(cfg)["train"]) == 123


def test_named_files_and_mismatched_lengths(tmp_path):
    files = write_corpus(tmp_path)
    cfg = DataConfig(train_files=files["train"], val_files=files["val"], test_files=files["test"])
    corpus = load_corpus(cfg)
    assert len(corpus["train"]) == 300 and len(corpus["test"]) == 30
    (tmp_path / "short.tgt").write_text("one line\n")
    cfg.val_files = [files["val"][0], str(tmp_path / "short.tgt")]
    with pytest.raises(NMTError, match="has 40 lines but"):
        load_corpus(cfg)


def test_missing_named_file_is_a_clear_error(tmp_path):
    cfg = DataConfig(train_files=[str(tmp_path / "a"), str(tmp_path / "b")], val_files=["x", "y"])
    with pytest.raises(NMTError, match="no such file"):
        load_corpus(cfg)


def test_unreachable_hub_names_paths_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True, raising=False)
    cfg = DataConfig(data_dir=str(tmp_path))
    with pytest.raises(NMTError) as err:
        load_corpus(cfg)
    message = str(err.value)
    assert str(tmp_path / "multi30k") in message and "bentrevett/multi30k" in message
    assert "data.train_files" in message and "\n" not in message


def test_joint_tokenizer_round_trip_and_cache(tmp_path):
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    data = prepare_data(cfg)
    path = tokenizer_path(cfg)
    assert path.is_file() and data.tokenizer.model_file == path
    # One model covers both languages: both sides round-trip without unknown pieces.
    for text in (data.text["val"][0]["src"], data.text["val"][0]["tgt"]):
        ids = data.tokenizer.encode([text])[0]
        assert 1 not in ids and data.tokenizer.decode([ids])[0] == text
    assert data.tokenizer.sp.pad_id() == PAD and data.tokenizer.sp.bos_id() == BOS
    # Cached: a second preparation reuses the same model and ids.
    mtime = path.stat().st_mtime_ns
    again = prepare_data(cfg)
    assert path.stat().st_mtime_ns == mtime
    assert again.ids["train"]["src_ids"] == data.ids["train"]["src_ids"]
    # The reverse direction shares the tokenizer.
    cfg.src_lang, cfg.tgt_lang = cfg.tgt_lang, cfg.src_lang
    assert tokenizer_path(cfg) == path


def test_max_len_filter(tmp_path):
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "d"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    data = prepare_data(cfg)
    kept = split_dataset(data, "train", max_len=5)
    assert 0 < len(kept) < 300
    assert all(len(s) <= 5 and len(t) <= 5 for s, t in zip(kept.src, kept.tgt))


def test_collate_adds_bos_eos_and_pads():
    batch = collate([(0, [5, 6], [7]), (1, [5], [7, 8, 9])])
    assert batch.src.tolist() == [[5, 6, EOS], [5, EOS, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 7, PAD, PAD], [BOS, 7, 8, 9]]
    assert batch.tgt_out.tolist() == [[7, EOS, PAD, PAD], [7, 8, 9, EOS]]
    assert batch.src_mask.tolist() == [[True, True, True], [True, True, False]]


def _lengths(n=500):
    import random

    rng = random.Random(0)
    return [rng.randint(1, 40) for _ in range(n)]


def test_sampler_budget_coverage_and_padding():
    lengths = _lengths()
    sampler = TokenBatchSampler(lengths, max_tokens=200, shuffle=True, seed=1)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in b) * len(b) <= 200 for b in batches)
    real = sum(lengths)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    assert (padded - real) / padded < 0.10  # length bucketing keeps padding small


def test_sampler_order_depends_on_seed_and_epoch_only():
    lengths = _lengths()
    a = TokenBatchSampler(lengths, 200, True, seed=1)
    b = TokenBatchSampler(lengths, 200, True, seed=1)
    assert list(a) == list(b)
    b.set_epoch(1)
    assert list(a) != list(b)
    a.set_epoch(1)
    assert list(a) == list(b)


def test_sampler_shards_across_ranks():
    lengths = _lengths()
    shards = [list(TokenBatchSampler(lengths, 200, True, 1, rank, 2)) for rank in range(2)]
    assert len(shards[0]) == len(shards[1])
    seen = [i for shard in shards for b in shard for i in b]
    assert len(seen) == len(set(seen))
    # Evaluation keeps every sentence.
    eval_shards = [list(TokenBatchSampler(lengths, 200, False, 0, r, 2)) for r in range(2)]
    assert sorted(i for s in eval_shards for b in s for i in b) == list(range(len(lengths)))


def test_pair_dataset_lengths():
    assert PairDataset([[1, 2, 3]], [[4]]).lengths() == [4]


def test_hub_translation_column_is_unpacked():
    import datasets

    from nmt.data.corpus import _hub_pairs

    split = datasets.Dataset.from_dict({"translation": [{"de": "Hallo", "en": "Hello"}]})
    pairs = _hub_pairs(split, "en", "de", "wmt14")
    assert pairs[0] == {"src": "Hello", "tgt": "Hallo"}
    columns = datasets.Dataset.from_dict({"en": ["a"], "de": ["b"], "image": [0]})
    assert _hub_pairs(columns, "de", "en", "bentrevett/multi30k")[0] == {"src": "b", "tgt": "a"}
