"""The Hugging Face Hub side of a corpus: a dataset resolved, then downloaded or streamed,
and its splits as one column per language of the pair.

A Hub dataset (``bentrevett/multi30k`` for multi30k, or ``data.hub_dataset``) is read where
no local files are found (``nmt.data.corpus``), either with one column per language or with a
``translation`` column of {lang: text} (a tab-separated file a pair a line, its quotes text:
``csv_options``); downloaded into the datasets cache, or with ``data.hub_streaming`` read as a
stream (WMT size: nothing is stored but the prepared ids).
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import datasets
from datasets.exceptions import DatasetGenerationError
from datasets.packaged_modules.csv.csv import CsvConfig

from nmt.config import DataConfig
from nmt.data.text_files import FileIdentity, RowFiles, file_identity
from nmt.errors import NMTError, first_line
from nmt.files import one_build_at_a_time, write_atomic

datasets.disable_progress_bars()  # one-off loading and caching; no bars in every run

HUB_DEFAULTS = {"multi30k": "bentrevett/multi30k"}
HUB_SPLITS = {"train": ("train",), "val": ("validation", "val", "valid"), "test": ("test",)}


@dataclass(frozen=True)
class HubSplit:
    """A downloaded Hub split. Its rows hold one column per language of the pair, in sorted
    order whatever the direction, so that both directions have one fingerprint (the cache's
    key: they share one prepared folder, as two files do); ``src`` and ``tgt`` name the
    columns read as source and target. ``local_files``: the identity of the split's files
    where they are on this machine (a local dataset folder's), for the cache's key as named
    files have it: the fingerprint knows a local file by its path and modification time
    alone; none for a Hub dataset's files (the fingerprint holds their revision)."""

    rows: datasets.Dataset
    src: str
    tgt: str
    row_files: RowFiles = RowFiles()  # checked when read (``check_rows``)
    local_files: tuple[FileIdentity, ...] = ()


@dataclass(frozen=True)
class HubStream:
    """A Hub split read as a stream: ``nmt prepare`` reads it twice (SentencePiece's sample,
    then the encoding) and never stores it whole. The cache knows it by name, configuration,
    split and version: a stream has no fingerprint of its content. A local dataset folder's
    stream is known by its files' identity too (``local_files``, as HubSplit's): by its name
    and version alone, a changed training file kept the ids prepared from the old text."""

    name: str
    config: str | None
    split: str
    rows: datasets.IterableDataset  # a column per language, as HubSplit's
    src: str
    tgt: str
    row_files: RowFiles = RowFiles()  # as HubSplit's
    local_files: tuple[FileIdentity, ...] = ()  # as HubSplit's


@dataclass(frozen=True)
class HubDataset:
    """A Hub dataset whose files are resolved (``resolve_hub``), nothing of it downloaded."""

    builder: datasets.DatasetBuilder  # with the options csv_options gives its files
    row_files: dict[str, RowFiles]  # each split's (by the dataset's names) to check


def hub_name(cfg: DataConfig) -> str | None:
    """The Hub dataset a corpus is read from where no local files are found (None: none)."""
    return cfg.hub_dataset or HUB_DEFAULTS.get(cfg.corpus)


def resolve_hub(cfg: DataConfig) -> HubDataset:
    """The configured Hub dataset with its files resolved and nothing downloaded (seconds,
    where a first download may take hours): an unreachable Hub or a dataset not found is its
    one-line error here, so that training checks it before its other options and loads it
    after (``from_hub``). A dataset of CSV or TSV files is resolved twice: once to find that
    it is (its builder's configuration), once with the options ``csv_options`` gives it."""
    languages = (cfg.src_lang, cfg.tgt_lang)
    with _hub_errors(cfg):
        builder = datasets.load_dataset_builder(hub_name(cfg), cfg.hub_config)
        if options := csv_options(builder.config, languages):
            builder = datasets.load_dataset_builder(hub_name(cfg), cfg.hub_config, **options)
    return HubDataset(builder, _row_files(builder.config))


def _row_files(config: datasets.BuilderConfig) -> dict[str, RowFiles]:
    """Each split's delimited files to check (``check_rows``): those of a CSV dataset read
    with a header line, its quotes as pandas reads them by default or none (``csv_options``:
    a ``.tsv``), split at one character (pandas takes a longer ``sep`` for a pattern)."""
    if not isinstance(config, CsvConfig) or config.header != "infer" or len(config.sep) != 1 \
            or config.escapechar or not config.doublequote \
            or config.quoting not in (csv.QUOTE_MINIMAL, csv.QUOTE_NONE):
        return {}
    quotechar = None if config.quoting == csv.QUOTE_NONE else config.quotechar
    return {split: RowFiles(tuple(files), config.sep, quotechar)
            for split, files in (config.data_files or {}).items()}


@contextmanager
def _hub_errors(cfg: DataConfig) -> Iterator[None]:
    """A Hub dataset that cannot be resolved or loaded as a one-line error: datasets raises
    many types (ConnectionError, FileNotFoundError, ...)."""
    name = hub_name(cfg)
    local = Path(cfg.data_dir) / cfg.corpus
    try:
        yield
    except Exception as err:
        if cfg.hub_dataset is not None:  # asked for by name: the local folder is not looked at
            raise NMTError(f"the Hub dataset '{name}' (data.hub_dataset) could not be loaded: "
                           f"{_reason(err)}. Drop data.hub_dataset to read {local}/, or set "
                           "data.train_files/data.val_files.") from None
        raise NMTError(
            f"corpus '{cfg.corpus}' ({cfg.src_lang}-{cfg.tgt_lang}) not found locally in {local}/ "
            f"(train|val|test_2016_flickr).<lang>[.gz]{languages_there(local)} and the Hub "
            f"dataset '{name}' could not be loaded: {_reason(err)}. Put the files there or set "
            "data.train_files/data.val_files."
        ) from None


def languages_there(folder: Path) -> str:
    """" (that folder has en, fr)": the languages of a local folder's training files; "" if none."""
    langs = sorted({match.group(1) for path in folder.glob("train.*")
                    if (match := re.fullmatch(r"train\.([^.]+)(?:\.gz)?", path.name))})
    return f" (that folder has {', '.join(langs)})" if langs else ""


def from_hub(cfg: DataConfig, hub: HubDataset) -> dict[str, HubSplit | HubStream]:
    """The splits of a resolved Hub dataset: downloaded (into datasets' cache, once), or
    opened as streams."""
    name = hub_name(cfg)
    with _hub_errors(cfg):  # as datasets.load_dataset loads
        local = _local_files(hub.builder.config)
        if cfg.hub_streaming:
            splits = hub.builder.as_streaming_dataset()
        else:
            _download_and_prepare(hub.builder, local)
            splits = hub.builder.as_dataset()
    corpus = {}
    for split, names in HUB_SPLITS.items():
        found = next((n for n in names if n in splits), None)
        if found is not None:
            src, tgt = cfg.src_lang, cfg.tgt_lang
            with stream_errors(name) if cfg.hub_streaming else nullcontext():  # reads its first rows
                rows = _language_columns(splits[found], src, tgt, name)
            files = hub.row_files.get(found, RowFiles())
            identity = local.get(found, ())
            corpus[split] = HubStream(name, cfg.hub_config, found, rows, src, tgt, files, identity) \
                if cfg.hub_streaming else HubSplit(rows, src, tgt, files, identity)
    if "train" not in corpus or "val" not in corpus:
        raise NMTError(f"Hub dataset '{name}' lacks a train or validation split: {list(splits)}")
    return corpus


def _local_files(config: datasets.BuilderConfig) -> dict[str, tuple[FileIdentity, ...]]:
    """Each split's data files on this machine (a local dataset folder's), by ``file_identity``
    (a millisecond a file); a split whose files are on the Hub (``hf://``) has none."""
    return {str(split): identities for split, files in (config.data_files or {}).items()
            if (identities := tuple(file_identity(path) for path in files if Path(path).is_file()))}


# Beside the rows datasets prepared from a local dataset folder: the identity of its files then
LOCAL_FILES_RECORD = "nmt_local_files.json"


def _download_and_prepare(builder: datasets.DatasetBuilder,
                          local: dict[str, tuple[FileIdentity, ...]]) -> None:
    """Download a dataset and prepare its rows in datasets' cache, once; a local dataset
    folder's again where its files are not those it was prepared from. datasets keys a local
    file by its path and modification time alone: a file replaced by another text with its
    time kept (``cp -p``, ``touch -r``) was served as the old text's rows. The files'
    identity (``local``) is recorded beside the rows; rows without that record (prepared
    before it was kept) are prepared again too. Processes loading the folder at once (a DDP
    run's ranks) take turns: the first prepares the rows, the others find them recorded
    (each would have prepared them anew, replacing the rows another was reading)."""
    if not local:  # a Hub dataset's: datasets' key holds its revision
        builder.download_and_prepare()
        return
    identity = json.dumps(local)
    rows = Path(builder.cache_dir)  # where datasets keeps this dataset's rows
    record = rows / LOCAL_FILES_RECORD
    with one_build_at_a_time(rows):
        try:
            stale = record.read_text(encoding="utf-8") != identity
        except OSError:  # none yet: prepared before it was kept, or never
            stale = True
        mode = datasets.DownloadMode.FORCE_REDOWNLOAD if stale else None  # None: reuse the rows
        builder.download_and_prepare(download_mode=mode)
        if stale:
            write_atomic(record, identity)


def _reason(err: Exception) -> str:
    """Why datasets could not load or read a dataset: the first line of its reader's error
    where datasets wraps it in one of its own ("An error occurred while generating the
    dataset")."""
    if isinstance(err, DatasetGenerationError) and err.__cause__ is not None:
        return first_line(err.__cause__)
    return first_line(err)


@contextmanager
def stream_errors(name: str) -> Iterator[None]:
    """A Hub stream that cannot be read on (a malformed line, a lost connection) as a one-line
    error: a stream reads its files as it goes, and datasets passes on its readers' errors,
    of many types (pandas', pyarrow's, json's, OSError)."""
    try:
        yield
    except NMTError:
        raise
    except Exception as err:
        raise NMTError(f"the Hub dataset '{name}' could not be read: {_reason(err)}") from None


def csv_options(config: datasets.BuilderConfig, languages: tuple[str, str]) -> dict:
    """What datasets' CSV builder (pandas' reader) is told to read a parallel corpus' text as
    written. A tab-separated file (``.tsv``) is a row a line, its quotes text: with the CSV
    default, a sentence starting with a double quote opened a quoted field that ran on to the
    next quote, often many lines later; those lines became one row, and every pair after it
    was silently misaligned. A comma-separated file keeps standard quoting. Either is text
    where pandas sees a missing value ("NA", "None", "null", "nan", "N/A", ...): such a
    sentence became an empty line; and where it sees numbers (a chunk of rows that all look
    like one): "007" became "7", "1.50" "1.5". What a dataset sets itself is kept."""
    if not isinstance(config, CsvConfig):
        return {}
    options = {}
    if config.converters is None and config.features is None:  # the pair's columns as text
        options["converters"] = dict.fromkeys(languages, str)  # a column the file lacks: ignored
    if config.keep_default_na and config.na_values is None:
        options["keep_default_na"] = False  # an empty field is still empty
    if config.sep == "\t" and config.quoting == csv.QUOTE_MINIMAL:
        options["quoting"] = csv.QUOTE_NONE
    return options


def _language_columns(split, src: str, tgt: str, name: str):
    """A Hub split (a ``Dataset``, or an ``IterableDataset`` when streamed) as one column per
    language of the pair, in sorted order (see ``HubSplit``): from per-language columns or
    ``translation``."""
    columns = split.column_names or list(next(iter(split)))  # a stream may not declare them
    pair = sorted((src, tgt))
    if src in columns and tgt in columns:
        return split.select_columns(pair)
    if "translation" in columns:
        languages = _translation_languages(split, name)
        if src not in languages or tgt not in languages:
            raise NMTError(f"Hub dataset '{name}' has no translations between {src} and {tgt}: "
                           f"its translation column holds {', '.join(languages)}")
        return split.map(
            lambda row: {lang: (row["translation"] or {}).get(lang) for lang in pair},  # null: ""
            remove_columns=columns,
        )
    raise NMTError(f"Hub dataset '{name}' has no columns for {src} and {tgt}: {columns}")


# A stream that declares no features shows its languages in its rows: in the first that holds
# a translation among this many (a null translation, an empty line, names none)
LANGUAGE_ROWS = 1000


def _translation_languages(split, name: str) -> list[str]:
    """The languages of a Hub split's ``translation`` column: a ``Translation`` feature's, a
    struct's keys, or (a stream that declares no features) those of its first row that holds
    a translation, among its first ``LANGUAGE_ROWS``."""
    feature = (split.features or {}).get("translation")
    if isinstance(feature, datasets.TranslationVariableLanguages):
        raise NMTError(f"Hub dataset '{name}' holds its translations with variable languages "
                       "(a language list a row), which is not read: give one with a column per "
                       "language, or a translation dict a row")
    if feature is None:
        first = next((row["translation"] for row in itertools.islice(split, LANGUAGE_ROWS)
                      if row["translation"]), None)
        if first is None:
            raise NMTError(f"Hub dataset '{name}' has no translation in the first {LANGUAGE_ROWS} "
                           "rows of its stream: no languages to read")
        return sorted(first)
    return list(getattr(feature, "languages", None) or feature)
