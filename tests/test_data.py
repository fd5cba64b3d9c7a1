"""Data path: corpus loading (local layout, named files, Hub failure), joint SentencePiece,
cached ids, and the token-budget sampler."""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import datasets
import huggingface_hub
import numpy as np
import pytest
import sentencepiece as spm

from nmt.cli import main
from nmt.cli.decoding import input_chunks
from nmt.config import DataConfig, load_config
from nmt.data import prepare as prepare_module
from nmt.data.batching import PairDataset, TokenBatchSampler, collate
from nmt.data.corpus import load_corpus, read_pairs, split_sources
from nmt.data.module import TranslationDataModule, prepare_data, split_dataset
from nmt.data.prepare import check_prepared_text, lines_sha1, load_side, prepare, sample_pairs
from nmt.data.text_files import RowFiles, check_rows
from nmt.data.tokenizer import BOS, EOS, PAD, train_tokenizer
from nmt.errors import NMTError

from .conftest import (
    MULTI30K,
    REPO,
    child_processes,
    run_stopped_while_preparing,
    tiny_train_args,
    write_corpus,
)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="data/multi30k not linked")
@pytest.mark.parametrize("src,tgt", [("de", "en"), ("en", "fr"), ("cs", "en")])
def test_local_multi30k_layout(src, tgt):
    corpus = load_corpus(DataConfig(data_dir=str(MULTI30K.parent), src_lang=src, tgt_lang=tgt))
    assert {k: len(v) for k, v in corpus.items()} == {"train": 29000, "val": 1014, "test": 1000}
    with gzip.open(MULTI30K / f"val.{src}.gz", "rt", encoding="utf-8") as f:
        first = f.readline().rstrip("\n")
    assert corpus["val"][0]["src"] == first


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="data/multi30k not linked")
def test_tokenizer_is_the_same_on_any_number_of_cores(tmp_path, monkeypatch):
    """SentencePiece learns other pieces with other thread counts (2 and 16 differ on these
    3,000 pairs); the tokenizer must not depend on the machine that trains it."""
    texts = []
    for lang in ("de", "en"):
        with gzip.open(MULTI30K / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += [next(f).rstrip("\n") for _ in range(3000)]
    pieces = {}
    for cores in (2, 16):
        monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
        tokenizer = train_tokenizer(texts, tmp_path / f"{cores}.model", 1000)
        pieces[cores] = [tokenizer.sp.id_to_piece(i) for i in range(len(tokenizer))]
    assert pieces[2] == pieces[16]


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
        load_corpus(cfg)["val"]  # splits are read when first used


def test_files_named_for_the_reverse_direction_are_an_error(tmp_path):
    """data.train_files=[train.de,train.en] with --src-lang en --tgt-lang de trained de->en
    under the name en->de, silently: the names' language codes, the other way round, say so.
    Other names (or one side's alone) are read as given."""
    files = write_corpus(tmp_path)
    named = {}
    for split, paths in files.items():
        named[split] = [str(tmp_path / f"{split}.de"), str(tmp_path / f"{split}.en.gz")]
        for path, new in zip(paths, named[split]):
            Path(new).write_bytes(gzip.compress(Path(path).read_bytes()) if new.endswith(".gz")
                                  else Path(path).read_bytes())
    cfg = DataConfig(train_files=named["train"], val_files=named["val"], src_lang="de", tgt_lang="en")
    assert len(load_corpus(cfg)["train"]) == 300
    cfg.src_lang, cfg.tgt_lang = "en", "de"
    with pytest.raises(NMTError, match=re.escape(
            "data.train_files [train.de, train.en.gz] is [source, target], but their names say "
            "de->en, the reverse of en->de: give [train.en.gz, train.de]")):
        load_corpus(cfg)
    cfg.src_lang = "fr"  # fr->de: the names say nothing of the order
    assert len(load_corpus(cfg)["train"]) == 300


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_files_of_different_lengths_are_an_error_when_only_a_prefix_is_read(tmp_path, suffix):
    """data.train_lines reads the first pairs alone: files of different lengths are still an
    error (a line dropped from one side shifted every pair after it, silently), while equal
    files, ending with a newline or without, read their prefix."""
    (tmp_path / "a").write_bytes(b"".join(b"line %d\n" % i for i in range(300)))
    (tmp_path / "b").write_bytes(b"".join(b"LINE %d\n" % i for i in range(300))[:-1])
    paths = []
    for name in ("a", "b"):
        data = (tmp_path / name).read_bytes()
        (tmp_path / (name + suffix)).write_bytes(gzip.compress(data) if suffix else data)
        paths.append(str(tmp_path / (name + suffix)))
    assert len(load_corpus(DataConfig(train_files=paths, val_files=paths, test_files=paths,
                                      train_lines=100))["train"]) == 100
    dropped = b"".join(b"LINE %d\n" % i for i in range(300) if i != 6)
    (tmp_path / ("b" + suffix)).write_bytes(gzip.compress(dropped) if suffix else dropped)
    cfg = DataConfig(train_files=paths, val_files=paths, test_files=paths, train_lines=100)
    with pytest.raises(NMTError, match=f"{paths[0]} has 300 lines but {paths[1]} has 299"):
        load_corpus(cfg)["train"]


def test_named_test_files_alone_are_an_error_not_ignored(tmp_path):
    """Test files named without the training files would be silently passed over for the
    folder's corpus: named files replace the whole corpus, so that is an error."""
    files = write_corpus(tmp_path)
    for split in ("val", "test"):
        cfg = DataConfig(data_dir=str(tmp_path), **{f"{split}_files": files[split]})
        with pytest.raises(NMTError, match="named files replace the whole corpus: data.train_files"):
            load_corpus(cfg)


def test_a_folder_named_as_a_corpus_file_is_called_a_folder(tmp_path):
    files = write_corpus(tmp_path)
    cfg = DataConfig(train_files=[str(tmp_path), files["train"][1]], val_files=files["val"])
    with pytest.raises(NMTError, match="is a folder, not a file"):
        load_corpus(cfg)


def test_missing_named_file_is_a_clear_error(tmp_path):
    cfg = DataConfig(train_files=[str(tmp_path / "a"), str(tmp_path / "b")], val_files=["x", "y"])
    with pytest.raises(NMTError, match="no such file"):
        load_corpus(cfg)


def test_unreachable_hub_names_paths_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True, raising=False)
    # an empty cache: offline, datasets would load a copy cached on this machine
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub_cache"))
    cfg = DataConfig(data_dir=str(tmp_path))
    with pytest.raises(NMTError) as err:
        load_corpus(cfg)
    message = str(err.value)
    assert str(tmp_path / "multi30k") in message and "bentrevett/multi30k" in message
    assert "data.train_files" in message and "\n" not in message
    assert "that folder has" not in message  # there is no such folder
    folder = tmp_path / "multi30k"
    folder.mkdir()
    for name in ("train.en.gz", "train.fr", "train.tok.de", "val.en", "README"):
        (folder / name).write_text("")
    with pytest.raises(NMTError, match=r"\(that folder has en, fr\)"):  # a user asked for another
        load_corpus(DataConfig(data_dir=str(tmp_path), src_lang="xx"))
    # A Hub corpus named by data.hub_dataset: the local folder is passed over, and the message
    # says so rather than asking for files that are there.
    cfg = DataConfig(data_dir=str(tmp_path), hub_dataset="wmt14", hub_config="de-en")
    with pytest.raises(NMTError) as err:
        load_corpus(cfg)
    assert str(err.value).startswith("the Hub dataset 'wmt14' (data.hub_dataset) could not be loaded")
    assert f"Drop data.hub_dataset to read {folder}/" in str(err.value)


def test_joint_tokenizer_round_trip_and_cache(tmp_path):
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    data = prepare_data(cfg)
    # One model covers both languages: both sides round-trip without unknown pieces.
    for text in (data.text["val"][0]["src"], data.text["val"][0]["tgt"]):
        ids = data.tokenizer.encode([text])[0]
        assert 1 not in ids and data.tokenizer.decode([ids])[0] == text
    assert data.tokenizer.sp.pad_id() == PAD and data.tokenizer.sp.bos_id() == BOS
    # The prepared ids are the tokenizer's.
    train = split_dataset(data, "train")
    assert train.src[7] == data.tokenizer.encode([data.text["train"][7]["src"]])[0]
    # Cached: a second preparation reuses the same folder untouched.
    mtime = (data.folder / "spm.model").stat().st_mtime_ns
    assert prepare(cfg) == data.folder
    assert (data.folder / "spm.model").stat().st_mtime_ns == mtime
    # The reverse direction shares the folder (ids are stored per language).
    cfg.src_lang, cfg.tgt_lang = cfg.tgt_lang, cfg.src_lang
    cfg.train_files, cfg.val_files = files["train"][::-1], files["val"][::-1]
    assert prepare(cfg) == data.folder


@pytest.mark.parametrize("vocab, spm_sample, said", [
    (80, 2, "a sample of 2 pairs (data.spm_sample) holds"),
    (80, 100_000, None),
    (120, 100_000, "the training split's 300 pairs hold")])
def test_a_vocabulary_smaller_than_asked_is_said(tmp_path, capsys, vocab, spm_sample, said):
    """SentencePiece makes what the sampled text allows (hard_vocab_limit=False): with
    data.spm_sample=2 a vocabulary of 80 asked came out of a few dozen pieces, most of the
    corpus' characters unknown, and nothing said so."""
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=files["train"],
                     val_files=files["val"], vocab_size=vocab, spm_sample=spm_sample)
    made = len(prepare_data(cfg).tokenizer)
    err = capsys.readouterr().err
    if said is None:
        assert made == vocab and "note: SentencePiece" not in err, err
    else:
        assert made < vocab
        assert f"  note: SentencePiece made {made} pieces of the {vocab} asked (data.vocab_size): " \
               f"{said} no more\n" in err, err


def test_a_build_killed_part_of_the_way_is_removed_by_the_next(tmp_path):
    """A preparation killed (SIGKILL, the OOM killer, SIGTERM) left its half-built folder,
    gigabytes for a large corpus, which nothing removed. The next preparation removes those of
    this host's processes that are gone, and leaves a running one's (or another host's)."""
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    folder = prepare_module.prepared_dir(cfg, split_sources(cfg))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = prepare_module._build_prefix(folder)
    abandoned, running, other_host = (folder.with_name(name) for name in (
        f"{prefix}{dead.pid}", f"{prefix}{os.getppid()}", f"{folder.name}.tmp-elsewhere-{dead.pid}"))
    for path in (abandoned, running, other_host):
        (path / "spm.model").parent.mkdir(parents=True)
        (path / "spm.model").write_text("half")
    prepare(cfg)
    assert not abandoned.exists() and running.is_dir() and other_host.is_dir()


class WaitingSeen(io.StringIO):
    """A stderr that sets ``event`` when a process says it waits for another's preparing."""

    def __init__(self, event: threading.Event):
        super().__init__()
        self.event = event

    def write(self, text: str) -> int:
        if text.startswith("waiting for another process preparing"):
            self.event.set()
        return super().write(text)


def test_two_preparations_of_one_folder_take_turns(tmp_path, monkeypatch):
    """Two processes preparing the same folder at once (two trainings started together,
    compare --jobs) each built it whole, side by side: three times the time of one on a large
    corpus, and a GB of memory each. The second now waits for the first and reads its folder.
    (Two threads here: the kernel's lock is per open file, so they contend as processes do.)"""
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    builds, second_waits, found = [], threading.Event(), []
    second = threading.Thread(target=lambda: found.append(prepare(cfg)))
    real_build = prepare_module._build

    def build(*args):
        builds.append(args)
        if len(builds) == 1:  # the first keeps building until the second has come to the folder
            second.start()
            while second.is_alive() and not second_waits.is_set():
                second_waits.wait(0.01)
        return real_build(*args)

    monkeypatch.setattr(prepare_module, "_build", build)
    monkeypatch.setattr(sys, "stderr", WaitingSeen(second_waits))
    folder = prepare(cfg)
    second.join()
    assert len(builds) == 1 and found == [folder] and (folder / "meta.json").is_file()


def test_a_prepared_folder_without_its_meta_json_is_prepared_again(tmp_path, capsys):
    """Its meta.json deleted (to prepare it again; ``nmt prepare --list`` calls such a folder
    "not a complete prepared folder"): the build's rename into it failed, "Directory not
    empty", naming the build's temporary folder, on every later prepare or train."""
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    folder = prepare(cfg)
    (folder / "meta.json").unlink()
    (folder / "stale").write_text("left by hand")
    assert prepare(cfg) == folder
    assert (folder / "meta.json").is_file() and not (folder / "stale").exists()
    assert f"removing {folder}: it has no meta.json" in capsys.readouterr().err
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no build left behind
    # A link in its place is not ours to delete: one line, and the link's target kept
    shutil.rmtree(folder)
    target = tmp_path / "elsewhere"
    target.mkdir()
    folder.symlink_to(target)
    with pytest.raises(NMTError, match="is not a prepared folder \\(no meta.json\\) and not ours"):
        prepare(cfg)
    assert target.is_dir() and folder.is_symlink()


def _local_layout(folder, files) -> DataConfig:
    """The write_corpus files as a local corpus folder data_dir/toy/{train,val}.{de,en}."""
    corpus = folder / "toy"
    corpus.mkdir(parents=True)
    for split in ("train", "val"):
        for path, lang in zip(files[split], ("de", "en")):
            shutil.copy(path, corpus / f"{split}.{lang}")
    return DataConfig(data_dir=str(folder), corpus="toy", vocab_size=120)


@pytest.mark.parametrize("change", ["corpus file", "spm_sample", "vocab_size", "train_lines"])
def test_cache_key_covers_inputs_and_options(tmp_path, change):
    cfg = _local_layout(tmp_path / "data", write_corpus(tmp_path))
    first = prepare(cfg)
    assert prepare(cfg) == first  # same inputs: reused
    if change == "corpus file":  # same name, new content (and a later modification time)
        path = tmp_path / "data" / "toy" / "val.en"
        path.write_text(path.read_text().upper())
        os.utime(path, ns=(time.time_ns() + 10**9,) * 2)
    else:
        setattr(cfg, change, {"spm_sample": 100, "vocab_size": 110, "train_lines": 200}[change])
    second = prepare(cfg)
    assert second != first and (second / "meta.json").is_file()
    if change == "corpus file":
        assert load_corpus(cfg)["val"][0]["tgt"] == split_text(second, "val")


def test_a_copy_with_its_times_kept_is_the_same_corpus(tmp_path):
    """Staged again as rsync -a or cp -a would (another inode, a new status-change time, the
    same text, size and modification time), a corpus reuses its prepared folder."""
    cfg = _local_layout(tmp_path / "data", write_corpus(tmp_path))
    first = prepare(cfg)
    corpus = tmp_path / "data" / "toy"
    shutil.copytree(corpus, tmp_path / "staged", copy_function=shutil.copy2)
    shutil.rmtree(corpus)
    (tmp_path / "staged").rename(corpus)
    assert prepare(cfg) == first


@pytest.mark.parametrize("large", [False, True])
def test_a_training_file_replaced_with_its_size_and_time_kept_is_prepared_again(
        tmp_path, monkeypatch, large):
    """A training file replaced by another text of the same size and modification time
    (`tac train.en > x; touch -r train.en x; mv x train.en`, or cp -p) reused the folder
    prepared from the old text: the key was path, size and time, and the training split
    is never compared with what was prepared. Its key now holds a sample of its bytes: the
    new text is prepared anew; ``large``: a file larger than the sample (read in blocks)."""
    if large:  # 4 blocks of 64 bytes: the 7 KB training files are read in part
        monkeypatch.setattr("nmt.data.text_files.SAMPLE_BYTES", 64)
        monkeypatch.setattr("nmt.data.text_files.SAMPLE_BLOCKS", 4)
    cfg = _local_layout(tmp_path / "data", write_corpus(tmp_path))
    first = prepare(cfg)
    train = tmp_path / "data" / "toy" / "train.en"
    before = train.stat()
    assert large == (before.st_size > (4 * 64 if large else 16 << 16))
    train.write_text("".join(reversed(train.read_text(encoding="utf-8").splitlines(keepends=True))),
                     encoding="utf-8")
    os.utime(train, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (train.stat().st_size, train.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = prepare(cfg)
    assert second != first
    reversed_ids = load_side(second, "train", "en").lengths.tolist()
    assert reversed_ids == load_side(first, "train", "en").lengths.tolist()[::-1]


def _hub_folder(folder: Path, files: dict) -> Path:
    """The write_corpus files as a dataset folder in the Hub's layout: {train,validation}.jsonl
    of {"translation": {"de": ..., "en": ...}}, which ``datasets.load_dataset`` reads offline."""
    folder.mkdir(parents=True)
    for split, name in (("train", "train"), ("val", "validation")):
        sides = [Path(path).read_text(encoding="utf-8").splitlines() for path in files[split]]
        rows = [json.dumps({"translation": {"de": s, "en": t}}) for s, t in zip(*sides)]
        (folder / f"{name}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def test_a_hub_dataset_is_resolved_once(tmp_path, monkeypatch):
    """Loading a Hub dataset resolved its files twice (load_dataset_builder to read its
    configuration, then load_dataset, which resolved them again: listings of the Hub, each
    time); once now, where its files are not CSV (whose options need a builder of their own)."""
    resolved = []
    factory = datasets.load.dataset_module_factory
    monkeypatch.setattr(datasets.load, "dataset_module_factory",
                        lambda *args, **kwargs: resolved.append(args[0]) or factory(*args, **kwargs))
    hub = _hub_folder(tmp_path / "hub", write_corpus(tmp_path))
    corpus = load_corpus(DataConfig(hub_dataset=str(hub)))
    assert len(corpus["train"]) == 300 and resolved == [str(hub)]


def test_a_bad_trainer_option_is_found_before_a_hub_download(tmp_path, monkeypatch, capsys):
    """nmt train downloaded a Hub dataset (hours, the first time, for WMT) before building
    its Trainer, so an option only the Trainer refuses (trainer.tensorboard without
    TensorBoard installed, as here) was found after the download. The dataset's files are
    now resolved first (a Hub out of reach is still the first line), downloaded after."""
    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'tensorboard'")

    monkeypatch.setattr("nmt.trainer.TensorBoardLogger", missing)
    downloads = []
    prepare_files = datasets.DatasetBuilder.download_and_prepare
    monkeypatch.setattr(datasets.DatasetBuilder, "download_and_prepare",
                        lambda self, *a, **k: downloads.append(self) or prepare_files(self, *a, **k))
    hub = _hub_folder(tmp_path / "hub", write_corpus(tmp_path))
    args = ["train", "--run-dir", str(tmp_path / "run"), f"data.data_dir={tmp_path / 'data'}",
            "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.tensorboard=true"]
    assert main([*args, f"data.hub_dataset={hub}"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        'error: trainer.tensorboard needs TensorBoard: pip install -e ".[tensorboard]"'
    assert downloads == []
    assert main([*args, f"data.hub_dataset={tmp_path / 'gone'}"]) == 1  # not found: the first
    assert capsys.readouterr().err.strip().startswith(  # (and only) line, as before
        f"error: the Hub dataset '{tmp_path / 'gone'}' (data.hub_dataset) could not be loaded: ")


def _tsv_folder(folder: Path, pairs: list[tuple[str, str]]) -> Path:
    """A local Hub dataset of tab-separated train and validation files, both of ``pairs``
    under a de/en header, written as they are (no quoting)."""
    folder.mkdir()
    for name in ("train", "validation"):
        (folder / f"{name}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in [("de", "en"), *pairs]),
                                            encoding="utf-8")
    return folder


@pytest.mark.parametrize("streaming", [False, True])
def test_a_hub_folder_of_tsv_or_csv_files_reads_each_pair_as_written(tmp_path, streaming):
    """A .tsv file is a pair a line, its quotes text: read with CSV quoting, a sentence that
    opened with a double quote ran on to the next quote, lines later, as one row, and every
    later pair shifted. A .csv file keeps its standard quoting. In either, what pandas reads
    as a missing value is a sentence (it was an empty line), and an empty field is empty."""
    pairs = [("a", "A"), ('"Hallo, sagte er', "He said"), ("b", "B"), ("c", 'C "really"'),
             ('"d"', 'D"'), ("NA", "None"), ("null", "N/A"), ("", "nan")]
    folder = _tsv_folder(tmp_path / "hub", pairs)
    corpus = load_corpus(DataConfig(hub_dataset=str(folder), hub_streaming=streaming))
    for split in ("train", "val"):
        assert list(zip(*next(read_pairs(corpus.sources[split])))) == pairs
    commas = tmp_path / "commas"
    commas.mkdir()
    for name in ("train", "validation"):
        (commas / f"{name}.csv").write_text('de,en\n"a, b","""A"", B"\nNULL,\n', encoding="utf-8")
    corpus = load_corpus(DataConfig(hub_dataset=str(commas), hub_streaming=streaming))
    assert list(zip(*next(read_pairs(corpus.sources["train"])))) == [("a, b", '"A", B'), ("NULL", "")]


@pytest.mark.parametrize("streaming", [False, True])
def test_a_dataset_folders_file_replaced_with_its_size_and_time_kept_is_prepared_again(
        tmp_path, monkeypatch, streaming):
    """A local dataset folder's train.tsv replaced by another text of the same size and
    modification time (cp -p, touch -r) reused the folder prepared from the old text, and
    datasets served the old text's rows from its cache: both know a local file by its path
    and modification time. The files' identity is now in the key, as named files' is, and
    datasets prepares the rows again: a new folder, of the new text. Read as a stream, the
    folder was known by its name alone (a stream of the Hub has no fingerprint): any new
    training text, of any size, kept the old ids."""
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "hf_cache")
    files = write_corpus(tmp_path)
    pairs = list(zip(*(Path(path).read_text(encoding="utf-8").splitlines()
                       for path in files["train"])))
    hub = _tsv_folder(tmp_path / "hub", pairs)
    cfg = DataConfig(data_dir=str(tmp_path / "data"), hub_dataset=str(hub), vocab_size=120,
                     hub_streaming=streaming)
    first = prepare(cfg)
    train = hub / "train.tsv"
    before = train.stat()
    header, *rows = train.read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text("".join([header, *reversed(rows)]), encoding="utf-8")
    os.utime(train, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (train.stat().st_size, train.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = prepare(cfg)
    assert second != first
    meta = json.loads((second / "meta.json").read_text())
    assert meta["text_sha1"]["train"]["en"] == lines_sha1([t for _, t in reversed(pairs)])


def test_processes_loading_a_dataset_folder_at_once_prepare_its_rows_once(tmp_path, monkeypatch):
    """Processes loading a local dataset folder at once (a DDP run's ranks) each found no
    record of the files its rows in datasets' cache were prepared from, and each prepared
    them anew, replacing the rows another was reading. The second now waits for the first
    and reuses the rows it recorded. (Two threads: the kernel's lock is per open file.)"""
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path / "hf_cache")
    cfg = DataConfig(hub_dataset=str(_tsv_folder(tmp_path / "hub", [("a", "A"), ("b", "B")])))
    modes, second_waits, found = [], threading.Event(), []
    second = threading.Thread(target=lambda: found.append(load_corpus(cfg)["train"]["tgt"]))
    real = datasets.DatasetBuilder.download_and_prepare

    def download_and_prepare(builder, *args, download_mode=None, **kwargs):
        modes.append(download_mode)
        if len(modes) == 1:  # the first prepares until the second has come to the rows
            second.start()
            while second.is_alive() and not second_waits.is_set():
                second_waits.wait(0.01)
        return real(builder, *args, download_mode=download_mode, **kwargs)

    monkeypatch.setattr(datasets.DatasetBuilder, "download_and_prepare", download_and_prepare)
    monkeypatch.setattr(sys, "stderr", WaitingSeen(second_waits))
    assert load_corpus(cfg)["train"]["tgt"] == ["A", "B"]
    second.join()
    assert modes == [datasets.DownloadMode.FORCE_REDOWNLOAD, None] and found == [["A", "B"]]


@pytest.mark.parametrize("streaming", [False, True])
def test_a_hub_file_of_numbers_keeps_their_text(tmp_path, streaming):
    """A column pandas takes for numbers (every value in a chunk of its rows looks like one)
    is text as written: read as numbers, "007" became "7" and "1.50" "1.5", silently."""
    pairs = [("007", "7"), ("1.50", "1,50"), ("2e3", "2000"), ("12", "0012")]
    folder = _tsv_folder(tmp_path / "numbers", pairs)
    corpus = load_corpus(DataConfig(hub_dataset=str(folder), hub_streaming=streaming))
    assert list(zip(*next(read_pairs(corpus.sources["train"])))) == pairs


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("bad_line", [3, 10_003])  # in the first chunk pandas reads, or later
def test_a_hub_file_that_cannot_be_read_is_one_line(tmp_path, capsys, streaming, bad_line):
    """A row datasets' reader refuses (a .tsv line with a tab too many) is a one-line error
    with the reader's reason, not "An error occurred while generating the dataset"; in a
    stream, which reads its files as it goes (its first rows when opened, the rest while
    being prepared), it was a traceback."""
    folder = tmp_path / "hub"
    folder.mkdir()
    rows = ["de\ten", *(f"s{i}\tt{i}" for i in range(10_010))]
    rows[bad_line - 1] += "\tthird"
    for name in ("train", "validation"):
        (folder / f"{name}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert main(["prepare", f"data.hub_dataset={folder}", f"data.data_dir={tmp_path / 'data'}",
                 f"data.hub_streaming={streaming}", "data.vocab_size=120"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.match(rf"error: the Hub dataset '{re.escape(str(folder))}' .*could not be (loaded|read): "
                    rf"Error tokenizing data. C error: Expected 2 fields in line {bad_line}, saw 3",
                    error)
    assert not list((tmp_path / "data").glob("prepared/*"))  # nothing half-built left


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("gzipped", [False, True])
def test_a_tsv_line_ends_at_its_newline_alone(tmp_path, capsys, monkeypatch, streaming, gzipped):
    """pandas ends a .tsv line at a lone carriage return too: the row was cut in two (a
    sentence with an empty side, then a pair of halves), silently. Such a line is now a
    one-line error naming the file and the line, wherever it is (in blocks of a few bytes
    here, as in the 16 MiB blocks of a large file), and nothing is left prepared; a file with
    Windows line ends still reads right, with no carriage return left in its targets."""
    monkeypatch.setattr("nmt.data.text_files.CHUNK_BYTES", 16)
    windows = "de\ten\r\n" + "".join(f"s{i}\tt{i}\r\n" for i in range(40))
    name = "train.tsv.gz" if gzipped else "train.tsv"

    def folder(path: Path, text: str) -> Path:
        path.mkdir()
        for split in ("train", "validation"):
            data = text.encode()
            (path / name.replace("train", split)).write_bytes(gzip.compress(data) if gzipped else data)
        return path

    corpus = load_corpus(DataConfig(hub_dataset=str(folder(tmp_path / "windows", windows)),
                                    hub_streaming=streaming))
    assert list(zip(*next(read_pairs(corpus.sources["train"])))) == [(f"s{i}", f"t{i}") for i in range(40)]
    lone = {3: windows.replace("s1\t", "s1\rx\t"),  # in a source
            30: windows.replace("t28\r\n", "t28\r\r\n"),  # ending a target, before \r\n
            41: windows.removesuffix("\n")}  # the file's last byte
    for line, text in lone.items():
        bad = folder(tmp_path / f"bad{line}", text)
        assert main(["prepare", f"data.hub_dataset={bad}", f"data.data_dir={tmp_path / 'data'}",
                     f"data.hub_streaming={streaming}", "data.vocab_size=60"]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: {bad / name}, line {line}: a carriage return (\\r) inside the line; lines "
            "end at \\n only, so pairs would shift: replace it with a space")
        assert not list((tmp_path / "data").glob("prepared/*"))  # nothing half-built left


@pytest.mark.parametrize("streaming", [False, True])
def test_a_tsv_line_without_its_tab_is_an_error(tmp_path, capsys, monkeypatch, streaming):
    """A .tsv line with fewer tabs than its header (a sentence broken over two lines, a tab
    lost) was read with an empty target and left out as such, silently, where the file is
    malformed: it is now a one-line error naming the file and line, wherever it is, and
    nothing is left prepared. Blank lines (pandas reads no row there) are no error."""
    monkeypatch.setattr("nmt.data.text_files.CHUNK_BYTES", 16)
    rows = ["id\tde\ten", *(f"{i}\ts{i}\tt{i}" for i in range(40))]
    rows.insert(5, "")  # blank lines: read as none,
    rows.insert(9, "\r")  # with a Windows line end too
    good = tmp_path / "good"
    good.mkdir()
    for split in ("train", "validation"):
        (good / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    corpus = load_corpus(DataConfig(hub_dataset=str(good), hub_streaming=streaming))
    assert list(zip(*next(read_pairs(corpus.sources["train"])))) == [(f"s{i}", f"t{i}") for i in range(40)]
    for line, short in ((3, "1\ts1 t1"), (30, "26\ts26"), (43, "t39")):  # the last line: no \n
        bad = tmp_path / f"bad{line}"
        bad.mkdir()
        lines = rows.copy()
        lines[line - 1] = short
        (bad / "train.tsv").write_text("\n".join(lines), encoding="utf-8")  # the last: no \n
        (bad / "validation.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        assert main(["prepare", f"data.hub_dataset={bad}", f"data.data_dir={tmp_path / 'data'}",
                     f"data.hub_streaming={streaming}", "data.vocab_size=60"]) == 1
        tabs = short.count("\t")
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"error: {bad / 'train.tsv'}, line {line}: {tabs} tab{'s' * (tabs != 1)} where the "
            "header line has 2: each line holds a whole pair (a sentence broken over two lines, "
            "or a tab lost?)")
        assert not list((tmp_path / "data").glob("prepared/*"))  # nothing half-built left


@pytest.mark.parametrize("streaming", [False, True])
def test_a_csv_row_with_fields_missing_is_an_error(tmp_path, capsys, monkeypatch, streaming):
    """A .csv row with fewer fields than its header (a comma lost, a sentence broken over two
    lines) was read with an empty target and left out as such, silently: it is now a one-line
    error naming the file and the line the row starts at, wherever it is, as a .tsv line's,
    and nothing is left prepared. Commas and line breaks inside quotes are no separators nor
    line ends, and a lone carriage return outside them is refused as in a .tsv file."""
    monkeypatch.setattr("nmt.data.text_files.CHUNK_BYTES", 16)
    monkeypatch.setattr("nmt.data.text_files.ROW_BLOCK", 4)
    rows = ["id,de,en", *(f"{i},s{i},t{i}" for i in range(40))]
    rows[3] = '2,"s2, ""quoted""","t2\nwith, a line break"'  # lines 4 and 5: one row
    rows.insert(7, "")  # a blank line: read as none
    good = tmp_path / "good"
    good.mkdir()
    for split in ("train", "validation"):
        (good / f"{split}.csv").write_text("\r\n".join(rows) + "\r\n", encoding="utf-8")
    corpus = load_corpus(DataConfig(hub_dataset=str(good), hub_streaming=streaming))
    pairs = list(zip(*next(read_pairs(corpus.sources["train"]))))
    assert pairs[2] == ('s2, "quoted"', "t2\nwith, a line break") and len(pairs) == 40
    for line, short, error in ((3, "1,s1 t1", "1 comma where the header line has 2: each line holds a "
                                "whole pair (a sentence broken over two lines, or a comma lost?)"),
                               (32, "27", "0 commas where the header line has 2: each line holds a "
                                "whole pair (a sentence broken over two lines, or a comma lost?)"),
                               (20, "16,s16\rx,t16", "a carriage return (\\r) inside the line; "
                                "lines end at \\n only, so pairs would shift: replace it with a space")):
        bad = tmp_path / f"bad{line}"
        bad.mkdir()
        lines = "\n".join(rows).split("\n")  # by line: the quoted line break makes two
        lines[line - 1] = short
        (bad / "train.csv").write_text("\n".join(lines), encoding="utf-8")  # the last: no \n
        (bad / "validation.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        assert main(["prepare", f"data.hub_dataset={bad}", f"data.data_dir={tmp_path / 'data'}",
                     f"data.hub_streaming={streaming}", "data.vocab_size=60"]) == 1
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last == f"error: {bad / 'train.csv'}, line {line}: {error}"
        assert not list((tmp_path / "data").glob("prepared/*"))  # nothing half-built left


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("compress", [bz2.compress, lzma.compress])
def test_a_compressed_or_downloaded_tsv_is_checked_as_a_local_one(tmp_path, capsys, monkeypatch,
                                                                    streaming, compress):
    """A Hub dataset's .tsv compressed otherwise than gzip (.bz2, .xz: datasets decompresses
    it) or downloaded from the Hub was not line-checked: a line without its tab was left out
    silently. It is read as datasets reads it and checked as a local .tsv is; a Hub file from
    the copy datasets downloaded into the Hub's cache, found without asking the Hub (one
    never downloaded, as when streamed, is not checked: that would download it twice). A Hub
    dataset out of reach is still its one-line error."""
    suffix = {bz2.compress: "bz2", lzma.compress: "xz"}[compress]
    bad = tmp_path / "bad"
    bad.mkdir()
    for split in ("train", "validation"):
        lines = ["de\ten", "a\tA", *(["b"] if split == "train" else []), "c\tC"]
        (bad / f"{split}.tsv.{suffix}").write_bytes(compress(("\n".join(lines) + "\n").encode()))
    assert main(["prepare", f"data.hub_dataset={bad}", f"data.data_dir={tmp_path / 'data'}",
                 f"data.hub_streaming={streaming}", "data.vocab_size=60"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {bad / f'train.tsv.{suffix}'}, line 3: 0 tabs where the header line has 1: each line "
        "holds a whole pair (a sentence broken over two lines, or a tab lost?)")
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "datasets--someone--pairs" / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "train.tsv").write_text("de\ten\na\tA\nb\n", encoding="utf-8")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    hub_file = f"hf://datasets/someone/pairs@{revision}/train.tsv"
    with pytest.raises(NMTError, match=rf"^{re.escape(hub_file)}, line 3: 0 tabs where the header"):
        check_rows(RowFiles((hub_file,)))
    check_rows(RowFiles((hub_file.replace("train", "test"),)))  # not downloaded: not checked
    assert main(["prepare", "data.hub_dataset=someone/pairs", f"data.data_dir={tmp_path / 'data'}"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: the Hub dataset 'someone/pairs' (data.hub_dataset) could not be loaded: ")


def test_a_streamed_hub_dataset_prepares_the_same_ids(tmp_path):
    """data.hub_streaming reads the dataset as a stream, twice (sample, encode), and ends with
    the ids the downloaded dataset and the same pairs as text files give."""
    files = write_corpus(tmp_path)
    hub = _hub_folder(tmp_path / "hub", files)
    folders = {}
    for streaming in (True, False):
        cfg = DataConfig(data_dir=str(tmp_path / f"data{streaming}"), hub_dataset=str(hub),
                         hub_streaming=streaming, vocab_size=120)
        folders[streaming] = prepare(cfg)
        cfg.src_lang, cfg.tgt_lang = cfg.tgt_lang, cfg.src_lang  # the other direction shares it,
        assert prepare(cfg) == folders[streaming]  # as two files do (it was prepared again)
    text = DataConfig(data_dir=str(tmp_path / "text"), train_files=files["train"],
                      val_files=files["val"], vocab_size=120)
    folders["text"] = prepare(text)
    ids = {k: [load_side(f, "train", lang).ids.tolist() for lang in ("de", "en")]
           for k, f in folders.items()}
    assert ids[True] == ids[False] == ids["text"] and len(ids[True][0]) > 300
    assert json.loads((folders[True] / "meta.json").read_text())["pairs"]["train"] == 300


def test_a_hub_streams_key_is_its_name_and_version_and_a_local_folders_adds_its_files(
        tmp_path, monkeypatch):
    """A Hub stream's key stays what it was (its name, configuration, split and version), so
    the folders prepared from streams before are reused; a local dataset folder's stream adds
    its files' identity, which its name alone did not give."""
    from nmt.data.corpus import source_identity
    from nmt.data.text_files import file_identity

    hub = _hub_folder(tmp_path / "hub", write_corpus(tmp_path))
    cfg = DataConfig(hub_dataset=str(hub), hub_streaming=True)
    (name, *files), = source_identity(load_corpus(cfg).sources["train"])
    assert name.startswith(f"stream {hub} None train ")
    assert files == [file_identity(str(hub / "train.jsonl"))]
    monkeypatch.setattr("nmt.data.hub._local_files", lambda config: {})  # files on hf://
    assert source_identity(load_corpus(cfg).sources["train"]) == [name]


@pytest.mark.parametrize("source", ["stream", "file"])
def test_a_text_changed_unseen_by_the_cache_is_not_scored_against_its_old_ids(tmp_path, source,
                                                                             monkeypatch):
    """A Hub stream's cache key is its name and version, a file's its size, modification time
    and a sample of its bytes: a dataset revised under the same name, or a file edited
    between its sampled blocks with its size and time kept, kept the prepared ids,
    and training scored validation BLEU of the old ids' sources against the new references.
    Training now checks the references against what was prepared."""
    files = write_corpus(tmp_path)
    if source == "stream":
        hub = _hub_folder(tmp_path / "hub", files)
        cfg = DataConfig(data_dir=str(tmp_path / "data"), hub_dataset=str(hub),
                         hub_streaming=True, vocab_size=120)
        validation = hub / "validation.jsonl"
        # a Hub dataset's files (hf://) are not on this machine: its key holds no identity of
        # them, as if this folder were one
        monkeypatch.setattr("nmt.data.hub._local_files", lambda config: {})
    else:
        cfg = _local_layout(tmp_path / "data", files)
        validation = tmp_path / "data" / "toy" / "val.en"
        # the key's sample of a file's bytes does not see an edit between its blocks (of a
        # large file): as if this were one
        monkeypatch.setattr("nmt.data.text_files.content_sample", lambda path: "the same blocks")
    folder = prepare(cfg)
    check_prepared_text(folder, "val", {"en": load_corpus(cfg)["val"]["tgt"]})  # as prepared: passes
    before = validation.stat()
    rows = validation.read_text(encoding="utf-8").splitlines(keepends=True)
    validation.write_text("".join(reversed(rows)), encoding="utf-8")  # same size, same name
    os.utime(validation, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert prepare(cfg) == folder  # the cache cannot see it ...
    with pytest.raises(NMTError, match=r"the val split's text changed since it was prepared in "
                       rf"{re.escape(str(folder))}: delete that folder"):
        check_prepared_text(folder, "val", {"en": load_corpus(cfg)["val"]["tgt"]})  # ... training does


def test_the_reverse_direction_trains_on_the_folder_the_other_prepared(tmp_path, capsys):
    """Both directions of a pair share one prepared folder, and training checks the folder
    against the validation text read now: the reverse direction's references are the other
    language's side. The folder recorded the preparing direction's targets alone, so the
    reverse direction stopped with 'the val split's text changed since it was prepared'."""
    files = write_corpus(tmp_path)
    data = tmp_path / "data"
    assert main(tiny_train_args(files, tmp_path / "de-en", data)) == 0
    reverse = {split: paths[::-1] for split, paths in files.items()}
    capsys.readouterr()
    assert main([*tiny_train_args(reverse, tmp_path / "en-de", data),
                 "--src-lang", "en", "--tgt-lang", "de"]) == 0, capsys.readouterr().err
    (folder,) = (data / "prepared").iterdir()  # the one folder, not prepared again
    # A folder prepared when only the preparing direction's targets were recorded serves both
    # directions too, and still finds a changed text
    meta = json.loads((folder / "meta.json").read_text())
    meta["target_sha1"] = {split: sides["en"] for split, sides in meta.pop("text_sha1").items()}
    (folder / "meta.json").write_text(json.dumps(meta))
    val = {lang: Path(path).read_text().splitlines() for lang, path in zip(("de", "en"), files["val"])}
    check_prepared_text(folder, "val", val)
    with pytest.raises(NMTError, match="the val split's text changed"):
        check_prepared_text(folder, "val", {lang: lines[::-1] for lang, lines in val.items()})


def split_text(folder, split) -> str:
    """The first target sentence of a prepared split, decoded."""
    from nmt.data.tokenizer import Tokenizer

    return Tokenizer(folder / "spm.model").decode([load_side(folder, split, "en")[0]])[0]


def test_spm_sample_is_uniform_and_keeps_corpus_order(tmp_path):
    files = write_corpus(tmp_path, sizes=(("train", 300),))
    src, tgt = sample_pairs(tuple(files["train"]), 50, None)
    lines = Path(files["train"][0]).read_text().splitlines()
    positions = [lines.index(s) for s in src]
    assert len(src) == len(tgt) == 50 and positions == sorted(positions)
    assert positions[-1] > 200  # drawn from the whole corpus, not its head
    assert sample_pairs(tuple(files["train"]), 1000, None)[0] == lines  # fewer: all, in order


def test_max_len_filter(tmp_path):
    files = write_corpus(tmp_path)
    cfg = DataConfig(data_dir=str(tmp_path / "d"), train_files=files["train"],
                     val_files=files["val"], vocab_size=120)
    data = prepare_data(cfg)
    kept = split_dataset(data, "train", max_len=5)
    assert 0 < len(kept) < 300
    assert all(len(kept.src[i]) <= 5 and len(kept.tgt[i]) <= 5 for i in range(len(kept)))


def test_training_leaves_out_pairs_with_an_empty_side_and_says_so(tmp_path, capsys):
    """Lines 1 and 2 of the training files lose their source or target: training leaves
    those two pairs out, with the long ones, and prints one line of what it left out; a
    corpus of which nothing is left is a one-line error before the run directory exists."""
    files = write_corpus(tmp_path)
    for side, line in ((0, 1), (1, 2)):
        path = Path(files["train"][side])
        lines = path.read_text(encoding="utf-8").splitlines()
        lines[line - 1] = ""
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    assert main(tiny_train_args(files, run, tmp_path / "data") + ["data.max_len=6"]) == 0
    out = capsys.readouterr().out.splitlines()
    data = prepare_data(load_config(run / "config.yaml").data)  # the run's, as prepared
    src, tgt = (load_side(data.folder, "train", lang).lengths for lang in ("de", "en"))
    assert (src == 0).sum() == (tgt == 0).sum() == 1
    long = int((((src > 6) | (tgt > 6)) & (src > 0) & (tgt > 0)).sum())
    kept = split_dataset(data, "train", max_len=6)
    assert len(kept) == 300 - 2 - long and long > 0
    assert all(len(kept.src[i]) > 0 and len(kept.tgt[i]) > 0 for i in range(len(kept)))
    assert (f"training on {len(kept):,} of 300 pairs: left out {long:,} longer than data.max_len "
            f"(6 pieces) and 2 with an empty side") in out
    assert main(tiny_train_args(files, tmp_path / "none", tmp_path / "data") + ["data.max_len=1"]) == 1
    err = capsys.readouterr().err
    assert "no training pair is left to train on: training on 0 of 300 pairs" in err
    assert err.count("\n") == 1 and not (tmp_path / "none").exists()


@pytest.mark.parametrize("content,line,reason", [
    (b"a one\rb two\nc three\n", 1, "carriage return"),
    ("x\ny one\u2028z two\n".encode(), 2, "U+2028"),
    ("x\ny\nz\u2029\n".encode(), 3, "U+2029"),
    (b"x\ny \xff\n", 2, "not valid UTF-8 (byte 2 of the line)"),
])
def test_line_breaks_inside_a_line_are_errors(tmp_path, content, line, reason):
    """Lines end at \\n only (as in translate): a stray separator would shift the pairs."""
    (tmp_path / "a").write_bytes(content)
    (tmp_path / "b").write_bytes(b"1\n2\n3\n")
    with pytest.raises(NMTError) as err:
        _read_all(tmp_path / "a", tmp_path / "b")
    message = str(err.value)
    assert f"{tmp_path / 'a'}, line {line}:" in message and reason in message
    assert "\n" not in message


def test_invalid_utf8_past_the_first_chunk_names_its_byte_in_the_line(tmp_path, monkeypatch):
    """The byte was counted from the start of the 16 MiB read chunk the line fell in."""
    from nmt.data import text_files

    monkeypatch.setattr(text_files, "CHUNK_BYTES", 64)
    (tmp_path / "a").write_bytes(b"".join(b"line %d\n" % i for i in range(40)) + b"abc\xff\n")
    (tmp_path / "b").write_bytes(b"x\n" * 41)
    with pytest.raises(NMTError, match=re.escape("line 41: not valid UTF-8 (byte 3 of the line)")):
        _read_all(tmp_path / "a", tmp_path / "b")


TEXT = "ein Hund läuft\nzwei Katzen\n"


PIPED = "decompress it into the pipe"  # stdin has no name to give


@pytest.mark.parametrize("name,content,what,piped", [
    ("train.de.xz", lzma.compress(TEXT.encode()), "it is xz-compressed, which is not read",
     f"it is xz-compressed: {PIPED}"),
    ("train.de.bz2", bz2.compress(TEXT.encode()), "it is bzip2-compressed, which is not read",
     f"it is bzip2-compressed: {PIPED}"),
    ("train.de", gzip.compress(TEXT.encode()), "it is gzip-compressed: give it a name ending in .gz",
     f"it is gzip-compressed: {PIPED}"),
    ("train.de", TEXT.encode("utf-16"), "it is UTF-16 text: convert it to UTF-8",
     "it is UTF-16 text: convert it to UTF-8"),
], ids=["xz", "bz2", "gzip without .gz", "utf-16"])
def test_a_file_that_is_not_utf8_text_is_named_for_what_it_is(tmp_path, name, content, what, piped):
    """A corpus downloaded compressed (WMT's and OPUS's come as .xz, .bz2 or .gz) or saved as
    UTF-16 was only "line 1: not valid UTF-8 (byte 0 of the line)"; translate's input too
    (which, from stdin, has no name to give it)."""
    (tmp_path / name).write_bytes(content)
    (tmp_path / "train.en").write_text(TEXT)
    with pytest.raises(NMTError, match=r"line 1: not valid UTF-8 \(byte \d+ of the line\); " + what):
        _read_all(tmp_path / name, tmp_path / "train.en")
    with pytest.raises(NMTError, match=r"^stdin, line 1: .*; " + piped):
        list(input_chunks(io.BytesIO(content), 10))
    with pytest.raises(NMTError, match=f"^{name}, line 1: .*; " + what):  # translate --input
        list(input_chunks(io.BytesIO(content), 10, name))


def test_crlf_line_ends_and_counts(tmp_path):
    (tmp_path / "a").write_bytes(b"one\r\ntwo\r\nthree")  # Windows ends, no final newline
    (tmp_path / "b").write_bytes(b"1\n2\n3\n")
    assert _read_all(tmp_path / "a", tmp_path / "b") == (["one", "two", "three"], ["1", "2", "3"])
    (tmp_path / "b").write_bytes(b"1\n2\n3\n4\n")
    with pytest.raises(NMTError, match=f"{tmp_path / 'a'} has 3 lines but {tmp_path / 'b'} has 4"):
        _read_all(tmp_path / "a", tmp_path / "b")


def _read_all(src_path, tgt_path) -> tuple[list[str], list[str]]:
    src, tgt = [], []
    for s, t in read_pairs((str(src_path), str(tgt_path))):
        src += s
        tgt += t
    return src, tgt


def test_reading_in_chunks_keeps_pairs_aligned(tmp_path, monkeypatch):
    """Chunks of different line counts on the two sides still pair line n with line n."""
    monkeypatch.setattr("nmt.data.text_files.CHUNK_BYTES", 7)
    (tmp_path / "a").write_text("".join(f"{i}\n" for i in range(50)))
    (tmp_path / "b").write_text("".join(f"line {i}\n" for i in range(50)))
    src, tgt = _read_all(tmp_path / "a", tmp_path / "b")
    assert [f"line {s}" for s in src] == tgt and len(src) == 50


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
    assert PairDataset([[1, 2, 3]], [[4]]).lengths().tolist() == [4]


def _sampler_before_numpy(lengths, max_tokens, shuffle, seed, rank, world_size, epoch):
    """The sampler as it was before it moved to numpy (commit 906a62c), as a reference."""
    rng = random.Random(seed + epoch)
    noise = [rng.random() for _ in lengths] if shuffle else [0.0] * len(lengths)
    indices = range(len(lengths)) if shuffle else range(len(lengths))[rank::world_size]
    order = sorted(indices, key=lambda i: (lengths[i], noise[i]))
    batches, current, longest = [], [], 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    if not shuffle:
        return batches
    rng.shuffle(batches)
    return batches[: len(batches) // world_size * world_size][rank::world_size]


@pytest.mark.parametrize("seed,world,shuffle", [(1, 1, True), (5, 2, True), (2, 3, False)])
def test_sampler_equals_the_python_sampler_it_replaced(seed, world, shuffle):
    lengths = _lengths(700) + [300]  # one pair over the budget still gets a batch
    for epoch in (0, 3):
        for rank in range(world):
            want = _sampler_before_numpy(lengths, 200, shuffle, seed, rank, world, epoch)
            sampler = TokenBatchSampler(lengths, 200, shuffle, seed, rank, world)
            sampler.set_epoch(epoch)
            assert list(sampler) == want and len(sampler) == len(want)


@pytest.fixture(scope="module")
def multi30k_prepared(tmp_path_factory):
    """Multi30k de-en prepared from scratch with the default options (about 30 s)."""
    data_dir = tmp_path_factory.mktemp("data")
    (data_dir / "multi30k").symlink_to(MULTI30K)
    return prepare_data(DataConfig(data_dir=str(data_dir)))


# Recorded from the code before the corpus pipeline moved to prepared numpy arrays (906a62c):
# sha1 of each batch's index list (json) for seed 1, default data options, one process.
PINNED = {
    0: (["453ba21c071a", "15a14f2b212b", "1c7423715072"], "9d1c0cd38304a809"),
    1: (["b9e6f4e430b7", "e0d2dfd3e9fa", "74edd59922c7"], "c5b4bbe671467974"),
}


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="data/multi30k not linked")
def test_multi30k_batches_are_pinned(multi30k_prepared):
    """Seed 1 on Multi30k de-en trains on exactly the batches of earlier versions, epoch by
    epoch, so published results stay reproducible."""
    cfg = DataConfig()
    train = split_dataset(multi30k_prepared, "train", cfg.max_len)
    assert len(train) == 29000
    sampler = TokenBatchSampler(train.lengths(), cfg.max_tokens, shuffle=True, seed=1)
    for epoch, (first, whole) in PINNED.items():
        sampler.set_epoch(epoch)
        batches = list(sampler)
        digest = [hashlib.sha1(json.dumps(b).encode()).hexdigest()[:12] for b in batches[:3]]
        # pinned with sentencepiece 0.2.3; 0.2.2 cuts other pieces (117 batches an epoch)
        why = f"other batches than the pinned ones, with sentencepiece {spm.__version__}"
        assert len(batches) == 123 and digest == first, why
        assert hashlib.sha1(json.dumps(batches).encode()).hexdigest()[:16] == whole, why


def test_batches_gather_from_flat_arrays():
    """A batch from a Ragged subset equals collate of the same pairs."""
    src = [[5, 6, 7], [8], [9, 10], []]
    tgt = [[11], [12, 13, 14], [15], [16, 17]]
    data = PairDataset(src, tgt)
    rows = [2, 0, 3]
    batch = data.__getitems__(rows)
    want = collate([(i, src[i], tgt[i]) for i in rows])
    for got, expected in zip(batch, want):
        assert got.tolist() == expected.tolist()
    assert list(TokenBatchSampler([], 100, shuffle=False)) == []  # nothing to translate
    kept = PairDataset(data.src.take(np.array([1, 2])), data.tgt.take(np.array([1, 2])))
    assert kept[1] == (1, [9, 10], [15])


def test_a_hub_split_reads_in_either_direction_under_one_fingerprint():
    """Both layouts (a translation column, a column per language), read as de->en and en->de:
    the pairs each way, and one cache identity for both directions (each direction had its
    own, and prepared its own folder and SentencePiece model)."""
    import datasets

    from nmt.data.corpus import source_identity
    from nmt.data.hub import HubSplit, _language_columns

    translation = datasets.Dataset.from_dict({"translation": [{"de": "Hallo", "en": "Hello"}]})
    columns = datasets.Dataset.from_dict({"en": ["Hello"], "de": ["Hallo"], "image": [0]})
    for split in (translation, columns):
        sources = {(src, tgt): HubSplit(_language_columns(split, src, tgt, "x"), src, tgt)
                   for src, tgt in (("de", "en"), ("en", "de"))}
        assert list(read_pairs(sources["de", "en"])) == [(["Hallo"], ["Hello"])]
        assert list(read_pairs(sources["en", "de"])) == [(["Hello"], ["Hallo"])]
        assert source_identity(sources["de", "en"]) == source_identity(sources["en", "de"])


def test_a_hub_translation_column_without_the_pair_is_one_line():
    """A KeyError traceback from inside datasets' map, for a language wmt14's de-en lacks."""
    import datasets

    from nmt.data.hub import HubStream, _language_columns

    split = datasets.Dataset.from_dict({"translation": [{"de": "Hallo", "en": "Hello"}]})
    with pytest.raises(NMTError, match="'wmt14' has no translations between fr and en: its "
                                       "translation column holds de, en"):
        _language_columns(split, "fr", "en", "wmt14")
    stream = split.to_iterable_dataset()  # declares features; one that does not: its first row
    stream._info.features = None
    with pytest.raises(NMTError, match="holds de, en"):
        _language_columns(stream, "en", "cs", "wmt14")
    # ... that holds a translation (a null one, an empty line, named no language)
    nulls = datasets.Dataset.from_dict({"translation": [None, {"de": "Hallo", "en": "Hello"}]})
    stream = nulls.to_iterable_dataset()
    stream._info.features = None
    pairs = HubStream("wmt14", None, "train", _language_columns(stream, "de", "en", "wmt14"), "de",
                      "en")
    assert list(read_pairs(pairs)) == [(["", "Hallo"], ["", "Hello"])]
    empty = datasets.Dataset.from_dict({"translation": [None] * 3}).to_iterable_dataset()
    empty._info.features = None
    with pytest.raises(NMTError, match="'wmt14' has no translation in the first 1000 rows"):
        _language_columns(empty, "de", "en", "wmt14")
    variable = datasets.Dataset.from_dict(
        {"translation": [{"language": ["de", "en"], "translation": ["Hallo", "Hello"]}]},
        features=datasets.Features({"translation": datasets.TranslationVariableLanguages(["de", "en"])}))
    with pytest.raises(NMTError, match="'wmt' holds its translations with variable languages"):
        _language_columns(variable, "de", "en", "wmt")


def test_a_hub_row_missing_a_side_is_an_empty_line_and_other_values_an_error():
    """A null translation was a TypeError traceback from SentencePiece."""
    import datasets

    from nmt.data.hub import HubSplit, _language_columns

    rows = {"de": ["a", "b", None], "en": [None, "c", "d"]}
    columns = HubSplit(datasets.Dataset.from_dict(rows), "de", "en")
    assert list(read_pairs(columns)) == [(["a", "b", ""], ["", "c", "d"])]
    translations = datasets.Dataset.from_dict({"translation": [{"de": "a", "en": None}, None]})
    pairs = _language_columns(translations, "de", "en", "wmt")  # a row's whole translation null
    assert list(read_pairs(HubSplit(pairs, "de", "en"))) == [(["a", ""], ["", ""])]
    numbers = HubSplit(datasets.Dataset.from_dict({"de": ["a", "b"], "en": [[1], [2]]}), "de", "en")
    with pytest.raises(NMTError, match=r"row 1 of a Hub split holds \[1\] as its target, not text"):
        list(read_pairs(numbers))


def test_prepare_command_and_a_bad_line(tmp_path, capsys, monkeypatch):
    from nmt.cli import main

    from .conftest import REPO

    files = write_corpus(tmp_path)
    argv = ["prepare", "--config", str(REPO / "configs" / "transformer.yaml"),
            f"data.train_files=[{','.join(files['train'])}]",
            f"data.val_files=[{','.join(files['val'])}]",
            "data.data_dir=data", "data.vocab_size=80"]
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--train-lines", "-5"]) == 1  # as train: no lines cut off the end
    assert "data.train_lines must be at least 1" in capsys.readouterr().err
    assert main(argv) == 0
    out, err = capsys.readouterr()
    folder = Path(out.split("prepared corpus: ")[1].strip())
    assert folder.is_absolute()  # as nmt train names it (it printed data/prepared/...)
    # Each stage is said as it ends: a large corpus was minutes of silence between the two lines
    stages = [re.sub(r"\d+ s$", "N s", line) for line in err.splitlines()]
    assert stages == [f"preparing {folder} ...", "  read and sample: N s", "  SentencePiece: N s",
                      "  encode train (300 pairs): N s", "  encode val (40 pairs): N s",
                      "prepared in N s"], err
    assert (folder / "meta.json").is_file() and (folder / "train.de.ids").is_file()
    lines = Path(files["val"][1]).read_text().split("\n")
    lines[2] = lines[2].replace(" ", "\u2028", 1)
    Path(files["val"][1]).write_text("\n".join(lines))
    assert main(argv) == 1
    err = capsys.readouterr().err  # "preparing <folder> ...", then the error
    assert err.splitlines()[-1].startswith(f"error: {files['val'][1]}, line 3: U+2028 LINE SEP")
    assert "Traceback" not in err


def test_paths_from_the_home_folder_in_a_config(tmp_path, capsys, monkeypatch):
    """A YAML config (or a bracketed override, where the shell expands nothing) naming
    ~/corpus/train.de looked for ./~/corpus/train.de, and data_dir: ~/data prepared the corpus
    into a new folder named ~ in the current one (which rm -rf ~ would then clear away...)."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    for folder in (home / "corpus", elsewhere):
        folder.mkdir(parents=True)
    write_corpus(home / "corpus")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    (elsewhere / "c.yaml").write_text("data:\n  train_files: [~/corpus/train.src, ~/corpus/train.tgt]\n"
                                      "  data_dir: ~/data\n  vocab_size: 100\n")
    assert main(["prepare", "--config", "c.yaml", "data.val_files=[~/corpus/val.src,~/corpus/val.tgt]"]) == 0
    folder = Path(capsys.readouterr().out.split("prepared corpus: ")[1].strip())
    assert folder.parent == home / "data" / "prepared" and (folder / "meta.json").is_file()
    assert list(elsewhere.iterdir()) == [elsewhere / "c.yaml"]
    assert load_config("c.yaml", ["run_dir=~/runs/x"]).run_dir == str(home / "runs" / "x")


def test_empty_training_corpus_is_a_clear_error(tmp_path):
    for name in ("c", "d"):
        (tmp_path / name).write_text("x\n")
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=[str(tmp_path / "a"),
                     str(tmp_path / "b")], val_files=[str(tmp_path / "c"), str(tmp_path / "d")])
    for text in ("", "\n \n\t\n"):  # no lines; blank lines only
        for name in ("a", "b"):
            (tmp_path / name).write_text(text)
        with pytest.raises(NMTError, match=re.escape(f"the training split ({tmp_path / 'a'}, "
                                                     f"{tmp_path / 'b'}) holds no text")):
            prepare(cfg)
        assert not list((tmp_path / "data" / "prepared").iterdir())  # nothing half-made left


def test_under_ddp_only_local_rank_0_prepares(tmp_path, monkeypatch):
    """A local rank > 0 (started first, as torchrun may) waits for rank 0's folder and reads
    it; it never prepares. Alone, it gives up with a clear error."""
    import subprocess
    import sys

    files = write_corpus(tmp_path)
    options = dict(data_dir=str(tmp_path / "data"), train_files=files["train"],
                   val_files=files["val"], vocab_size=120)
    code = ("import sys; from nmt.config import DataConfig; from nmt.data.prepare import prepare; "
            f"print(prepare(DataConfig(**{options!r})))")
    waiting = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "LOCAL_RANK": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        folder = prepare(DataConfig(**options))  # rank 0
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()  # a rank left waiting would wait for hours
    assert waiting.returncode == 0 and Path(out.strip()) == folder
    assert "preparing" not in err

    from nmt.data import prepare as prepare_module

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(prepare_module, "WAIT_SECONDS", 0)
    with pytest.raises(NMTError, match="gave up waiting for local rank 0"):
        prepare(DataConfig(**{**options, "vocab_size": 110}))


def test_ranks_waiting_for_the_data_stop_with_local_rank_0s_error(tmp_path, monkeypatch):
    """Started each by its launcher (SLURM's, say), rank 1 waited 4 hours in silence for the
    folder of a rank 0 that had failed; a failure from an earlier launch is not this one's."""
    from nmt.data import prepare as prepare_module

    files = write_corpus(tmp_path)
    (tmp_path / "short.en").write_text("one line\n")
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=[files["train"][0],
                     str(tmp_path / "short.en")], val_files=files["val"], vocab_size=120)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(NMTError, match="lines") as rank_0:
        prepare(cfg)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(prepare_module, "WAIT_SECONDS", 5)  # not 4 hours, where this fails
    with pytest.raises(NMTError, match="local rank 0 could not prepare") as rank_1:
        prepare(cfg)
    assert str(rank_0.value) in str(rank_1.value)
    marker = next((tmp_path / "data" / "prepared").glob("*.failed"))
    os.utime(marker, (time.time() - 3600, time.time() - 3600))  # an earlier launch's
    monkeypatch.setattr(prepare_module, "WAIT_SECONDS", 0)
    with pytest.raises(NMTError, match="gave up waiting for local rank 0"):
        prepare(cfg)


@pytest.mark.parametrize("val_pairs, max_tokens, fits, refused, message", [
    # 30 short pairs in one batch of 2,000 tokens leave a second process no training batch (it
    # ended in a ZeroDivisionError after fit, with the checkpoints of an untrained model written)
    (5, 2000, 1, 2,
     "the training pairs make 1 batch.es. of data.max_tokens 2000, fewer than the 2 processes"),
    # each process validates on every world_size-th sentence: 3 left a fourth none, and Lightning
    # stopped it with a traceback ("`DataLoader` within local rank has zero length")
    (3, 60, 3, 4, "the validation split has 3 pair.s., fewer than the 4 processes"),
])
def test_a_process_without_batches_of_its_own_is_refused(tmp_path, val_pairs, max_tokens, fits,
                                                         refused, message):
    """Under DDP each process trains on a whole number of batches of its own and validates on
    sentences of its own. ``train`` makes this check before the run directory is made; here
    it is called as for ``fits`` and ``refused`` processes."""
    from nmt.training import check_batches_per_process

    files = write_corpus(tmp_path, sizes=(("train", 30), ("val", val_pairs)))
    config = load_config("configs/transformer.yaml", [
        f"data.train_files=[{','.join(files['train'])}]", f"data.val_files=[{','.join(files['val'])}]",
        f"data.data_dir={tmp_path / 'data'}", "data.vocab_size=60", f"data.max_tokens={max_tokens}"])
    module = TranslationDataModule(prepare_data(config.data), config.data, 0, 512)
    check_batches_per_process(module, config, fits)
    with pytest.raises(NMTError, match=message):
        check_batches_per_process(module, config, refused)


@pytest.mark.parametrize("damage", ["truncated ids", "meta.json", "meta.json gone", "lengths"])
def test_a_damaged_prepared_corpus_is_named_in_one_line(tmp_path, damage):
    """Prepared folders are written whole, so damage came later (a disk, a person): an index
    error deep in a batch, or a JSON traceback, named neither the folder nor the cure."""
    files = write_corpus(tmp_path)
    cfg = DataConfig(train_files=files["train"], val_files=files["val"],
                     data_dir=str(tmp_path / "data"), vocab_size=100)
    folder = prepare(cfg)
    if damage == "truncated ids":
        ids = folder / "train.de.ids"
        ids.write_bytes(ids.read_bytes()[:-8])
    elif damage == "meta.json":
        (folder / "meta.json").write_text("{")
    elif damage == "meta.json gone":  # deleted after prepare() found it: a FileNotFoundError
        (folder / "meta.json").unlink()
    else:
        (folder / "train.en.lengths.npy").write_bytes(b"no array")
    with pytest.raises(NMTError, match=f"the prepared corpus in {re.escape(str(folder))} is "
                                       r"damaged \(.+\): delete the folder"):
        for lang in ("de", "en"):
            load_side(folder, "train", lang)


@pytest.mark.parametrize("corpus", ["../../elsewhere", "owner/name"])
def test_a_corpus_name_with_slashes_is_prepared_under_prepared(tmp_path, corpus):
    from nmt.data.prepare import prepared_dir

    cfg = DataConfig(corpus=corpus, data_dir=str(tmp_path / "data"))
    folder = prepared_dir(cfg, {})
    assert folder.parent == tmp_path / "data" / "prepared"
    assert folder.name.startswith(corpus.replace("/", "--") + ".de-en.")


def test_a_prepared_folder_is_named_after_what_it_was_prepared_from(tmp_path):
    """Named files were prepared into a folder named after data.corpus (multi30k.de-en....):
    it is named after the files now, in either direction, and a local dataset folder after
    that folder (not its path, with "/" as "--")."""
    from nmt.data.prepare import prepared_dir

    folder = tmp_path / "iwslt14"
    folder.mkdir()
    for name in ("train.de", "train.en", "val.de", "val.en"):
        (folder / name).write_text("a b\n", encoding="utf-8")
    named = []
    for src, tgt in (("de", "en"), ("en", "de")):
        cfg = DataConfig(data_dir=str(tmp_path / "data"), src_lang=src, tgt_lang=tgt,
                         train_files=[str(folder / f"train.{lang}") for lang in (src, tgt)],
                         val_files=[str(folder / f"val.{lang}") for lang in (src, tgt)])
        named.append(prepared_dir(cfg, split_sources(cfg)).name)
    assert named[0] == named[1] and named[0].startswith("iwslt14-train.de-en.")
    hub = _hub_folder(tmp_path / "my_tsv", write_corpus(tmp_path))
    cfg = DataConfig(data_dir=str(tmp_path / "data"), hub_dataset=str(hub))
    assert prepared_dir(cfg, split_sources(cfg)).name.startswith("my_tsv.de-en.")


def test_files_named_from_the_folder_above_are_named_after_that_folder(tmp_path, monkeypatch):
    """train_files=[../train.de,../train.en] was prepared into "..-train.de-en.<key>", a
    hidden folder named after "..", and a dataset folder given as "my_tsv/sub/.." into
    "...de-en.<key>": each is named after the folder ".." stands for."""
    from nmt.data.prepare import prepared_dir

    folder = tmp_path / "iwslt14"
    (folder / "sub").mkdir(parents=True)
    for name in ("train.de", "train.en", "val.de", "val.en"):
        (folder / name).write_text("a b\n", encoding="utf-8")
    monkeypatch.chdir(folder / "sub")
    cfg = DataConfig(data_dir=str(tmp_path / "data"), train_files=["../train.de", "../train.en"],
                     val_files=["../val.de", "../val.en"])
    assert prepared_dir(cfg, split_sources(cfg)).name.startswith("iwslt14-train.de-en.")
    hub = _hub_folder(tmp_path / "my_tsv", write_corpus(tmp_path))
    (hub / "sub").mkdir()
    cfg = DataConfig(data_dir=str(tmp_path / "data"), hub_dataset=str(hub / "sub" / ".."))
    assert prepared_dir(cfg, split_sources(cfg)).name.startswith("my_tsv.de-en.")


def test_sentencepiece_refusing_a_corpus_is_one_line_and_leaves_nothing(tmp_path):
    """SentencePiece's own error, from the process it trains in, is the message."""
    with pytest.raises(NMTError, match=r"^SentencePiece training failed: .*Vocabulary size is "
                       r"smaller than required_chars\. 5 vs \d+\. Increase vocab_size"):
        train_tokenizer(["abcdefgh"], tmp_path / "spm.model", 5)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_stops_sentencepiece_training_at_once(tmp_path):
    """Ctrl-C while SentencePiece trained waited for it to end (31 s on a sample of 200,000
    pairs): its C++ returns to Python, where a signal's handler runs, only then. It trains
    in a child process now, which is killed at once, and the half-built folder is removed as
    at any other stage. The corpus takes SentencePiece seconds to learn (3 to 4 s on 2 cores)."""
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyzäöü", k=rng.randint(3, 12)))
             for _ in range(50_000)]
    files = {}
    for split, pairs in (("train", 60_000), ("val", 10)):
        files[split] = [tmp_path / f"{split}.{lang}" for lang in ("de", "en")]
        for path in files[split]:
            path.write_text("".join(" ".join(rng.choices(words, k=12)) + "\n" for _ in range(pairs)),
                            encoding="utf-8")
    prepared = tmp_path / "data" / "prepared"
    command = [sys.executable, "-m", "nmt", "prepare", f"data.data_dir={tmp_path / 'data'}",
               f"data.train_files=[{','.join(map(str, files['train']))}]",
               f"data.val_files=[{','.join(map(str, files['val']))}]"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,  # Python's Ctrl-C
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(prepared.glob("*/tmp*")):  # SentencePiece's folder: its training begins
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.05)
    time.sleep(0.5)
    children = child_processes(process.pid)
    threading.Timer(120, process.kill).start()  # a hung command fails the test, not the suite
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    said = []
    for line in process.stderr:  # said once the folder is removed, before Python's own exit
        said.append(line)
        if line == "interrupted\n":
            break
    # Up to here: the exit that follows (1.4 s with torch loaded, on 2 busy cores) took the
    # whole command past 2 s where it was timed, failing the test with SentencePiece stopped
    stopped = time.monotonic() - sent
    error = "".join(said) + process.communicate()[1]
    assert stopped < 2, "waited for SentencePiece to finish"
    assert process.returncode == 130 and error.endswith("interrupted\n"), error
    assert list(prepared.iterdir()) == []
    assert not any(Path(f"/proc/{pid}").exists() for pid in children)  # no trainer left


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie waiting to be reaped (an
    orphan's new parent, a container's first process, may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl")
def test_sentencepiece_training_dies_with_its_parent(tmp_path):
    """SentencePiece trains in a child process; its parent killed (SIGKILL: the OOM killer,
    kill -9), which no handler sees, left it training on, orphaned, for seconds to minutes,
    writing its model into a folder no one would read. It now dies with its parent. The text
    takes SentencePiece seconds to learn (7 s on 2 busy cores)."""
    code = f"""if True:
        import random
        from pathlib import Path
        from nmt.data.tokenizer import train_tokenizer
        rng = random.Random(0)
        words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 12)))
                 for _ in range(50_000)]
        texts = [" ".join(rng.choices(words, k=12)) for _ in range(100_000)]
        train_tokenizer(texts, Path({str(tmp_path / "spm.model")!r}), 8000)"""
    parent = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not (children := child_processes(parent.pid)):
        assert parent.poll() is None and time.monotonic() < deadline, "no SentencePiece child"
        time.sleep(0.02)
    time.sleep(0.5)  # into its training
    parent.kill()
    parent.wait()
    try:
        deadline = time.monotonic() + 1
        while _running(children[0]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _running(children[0]), "SentencePiece trained on after its parent was killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(children[0], signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl")
def test_sentencepiece_child_whose_parent_ended_before_it_started_ends(tmp_path):
    """The parent may end before its child has asked to die with it (the request is then
    never answered): the child, seeing another parent, ends at once, training nothing."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process that has ended, as the parent it was started by
    work = pickle.dumps((["a few words", "and a few more"], str(tmp_path / "spm"), 12))
    child = subprocess.run([sys.executable, "-c", "from nmt.data.tokenizer import train_child; "
                            f"train_child({gone.pid})"], input=work, capture_output=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert list(tmp_path.iterdir()) == []


def test_encoding_threads_are_the_cpus_this_process_may_run_on(tmp_path, monkeypatch):
    """A job given 1 of a machine's 64 cores (taskset, Slurm, a container's cpuset) encoded its
    corpus with 64 threads on that core: os.cpu_count() counts the machine's."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    threads = []

    class Pieces:  # a tokenizer that notes the threads it is given
        def encode(self, lines, workers):
            threads.append(workers)
            return [[5] * len(line.split()) for line in lines]

    chunks = [(["ein haus", "ein hund"], ["a house", "a dog"])]
    stems = [tmp_path / "train.de", tmp_path / "train.en"]
    assert prepare_module._encode_split(chunks, Pieces(), np.int16, stems)[0] == 2
    assert threads == [1, 1]


def test_a_preparation_stopped_by_sigterm_leaves_no_build_folder(tmp_path):
    """SIGTERM (a scheduler, kill) while a corpus was prepared left its half-built folder
    (gigabytes for a large corpus) until the next preparation, and exited without a word; as
    on Ctrl-C, it is now removed, and the command says it was stopped."""
    files = write_corpus(tmp_path)
    argv = ["prepare", "--config", str(REPO / "configs" / "transformer.yaml"),
            f"data.train_files=[{','.join(files['train'])}]",
            f"data.val_files=[{','.join(files['val'])}]",
            f"data.data_dir={tmp_path / 'data'}", "data.vocab_size=100"]
    process = run_stopped_while_preparing(argv)
    assert process.returncode == 143, process.stderr
    assert process.stderr.endswith("stopped by SIGTERM\n"), process.stderr
    assert list((tmp_path / "data" / "prepared").iterdir()) == []


def test_sentencepiece_child_imports_nmt_from_the_parents_path(tmp_path, monkeypatch):
    """SentencePiece trains in a child interpreter, which must import nmt where this process
    did: a script that put an uninstalled checkout on its sys.path got no nmt in the child,
    or another one. Here an nmt first on the path answers for the child, and is heard."""
    tokenizer = tmp_path / "other" / "nmt" / "data" / "tokenizer.py"
    tokenizer.parent.mkdir(parents=True)
    for package in (tokenizer.parent, tokenizer.parent.parent):
        (package / "__init__.py").write_text("")
    tokenizer.write_text("import sys\ndef train_child(parent):\n    sys.exit('the nmt first on the path')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "other"))  # nmt itself is imported already
    with pytest.raises(NMTError, match="SentencePiece training failed: the nmt first on the path"):
        train_tokenizer(["a few words", "and a few more"], tmp_path / "spm.model", 12)
