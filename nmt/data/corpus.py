"""Parallel corpora as a ``datasets.DatasetDict`` with splits train/val/test of {src, tgt}.

Three sources, tried in this order:
1. plain-text files the user names (``data.train_files`` = [source, target], ...);
2. unless ``data.hub_dataset`` is set, a local folder in the Multi30k layout:
   ``<data_dir>/<corpus>/{train,val,test_2016_flickr}.<lang>[.gz]``;
3. a Hugging Face Hub dataset (``bentrevett/multi30k`` for multi30k, or ``data.hub_dataset``),
   either with one column per language or with a ``translation`` column of {lang: text}.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import datasets

from nmt.config import DataConfig
from nmt.errors import NMTError

SPLITS = ("train", "val", "test")
# Local file stems of each split, first match wins (Multi30k names its test set by year).
LOCAL_STEMS = {
    "train": ("train",),
    "val": ("val", "valid", "dev"),
    "test": ("test_2016_flickr", "test"),
}
datasets.disable_progress_bars()  # one-off loading and caching; no bars in every run

HUB_DEFAULTS = {"multi30k": "bentrevett/multi30k"}
HUB_SPLITS = {"train": ("train",), "val": ("validation", "val", "valid"), "test": ("test",)}


def load_corpus(cfg: DataConfig) -> datasets.DatasetDict:
    """Load the configured corpus; ``train`` is cut to ``cfg.train_lines`` if set."""
    if cfg.train_files:
        corpus = _from_named_files(cfg)
    elif cfg.hub_dataset is None and (local := _local_files(cfg)) is not None:
        corpus = _from_text_files(local)
    else:
        corpus = _from_hub(cfg)
    if cfg.train_lines is not None and cfg.train_lines < len(corpus["train"]):
        corpus["train"] = corpus["train"].select(range(cfg.train_lines))
    return corpus


def corpus_name(cfg: DataConfig) -> str:
    """A cache key for the corpus: its name, the Hub dataset asked for, or a fingerprint of
    user-named files."""
    if cfg.hub_dataset:
        return "-".join(filter(None, (cfg.hub_dataset, cfg.hub_config))).replace("/", "--")
    if not cfg.train_files:
        return cfg.corpus
    named = [p for files in (cfg.train_files, cfg.val_files, cfg.test_files) for p in files or []]
    stamp = [(str(Path(p).resolve()), Path(p).stat().st_size, Path(p).stat().st_mtime_ns)
             for p in named if Path(p).is_file()]
    return f"{cfg.corpus}-{hashlib.sha1(repr(stamp).encode()).hexdigest()[:10]}"


def _from_named_files(cfg: DataConfig) -> datasets.DatasetDict:
    files = {}
    for split in SPLITS:
        pair = getattr(cfg, f"{split}_files")
        if pair is None:
            continue
        if len(pair) != 2:
            raise NMTError(f"data.{split}_files needs two paths [source, target], got {pair}")
        for path in pair:
            if not Path(path).is_file():
                raise NMTError(f"data.{split}_files: no such file: {path}")
        files[split] = tuple(pair)
    if "train" not in files or "val" not in files:
        raise NMTError("data.train_files and data.val_files are both required with named files")
    return _from_text_files(files)


def _local_files(cfg: DataConfig) -> dict[str, tuple[str, str]] | None:
    """Map each split to its (source, target) files under data_dir/corpus, or None if absent."""
    folder = Path(cfg.data_dir) / cfg.corpus
    files = {}
    for split, stems in LOCAL_STEMS.items():
        for stem in stems:
            pair = [_existing(folder / f"{stem}.{lang}") for lang in (cfg.src_lang, cfg.tgt_lang)]
            if all(pair):
                files[split] = tuple(pair)
                break
    if "train" in files and "val" in files:
        return files
    return None


def _existing(stem: Path) -> str | None:
    for path in (stem, stem.with_name(stem.name + ".gz")):
        if path.is_file():
            return str(path)
    return None


def _from_text_files(files: dict[str, tuple[str, str]]) -> datasets.DatasetDict:
    """Read aligned text files (optionally gzipped) through the datasets ``text`` builder."""
    corpus = {}
    for split, (src_path, tgt_path) in files.items():
        src = _read_lines(src_path)
        tgt = _read_lines(tgt_path)
        if len(src) != len(tgt):
            raise NMTError(
                f"{split}: {src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}"
            )
        corpus[split] = src.rename_column("text", "src").add_column("tgt", tgt["text"])
    return datasets.DatasetDict(corpus)


def _read_lines(path: str) -> datasets.Dataset:
    try:
        data = datasets.load_dataset("text", data_files=path, split="train")
    except UnicodeDecodeError as err:
        raise NMTError(f"{path} is not valid UTF-8 ({err.reason})") from None
    return data


def _from_hub(cfg: DataConfig) -> datasets.DatasetDict:
    name = cfg.hub_dataset or HUB_DEFAULTS.get(cfg.corpus)
    local = Path(cfg.data_dir) / cfg.corpus
    pair = f"{cfg.src_lang}-{cfg.tgt_lang}"
    if name is None:
        raise NMTError(
            f"corpus '{cfg.corpus}' not found: no {local}/train.{cfg.src_lang}[.gz] etc. "
            "and no data.hub_dataset given; point data.train_files/data.val_files at local files"
        )
    try:
        hub = datasets.load_dataset(name, cfg.hub_config)
    except Exception as err:  # datasets raises many types (ConnectionError, FileNotFoundError, ...)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise NMTError(
            f"corpus '{cfg.corpus}' ({pair}) not found locally in {local}/ "
            f"(train|val|test_2016_flickr).<lang>[.gz] and the Hub dataset '{name}' could not be "
            f"loaded: {reason}. Put the files there or set data.train_files/data.val_files."
        ) from None
    corpus = {}
    for split, names in HUB_SPLITS.items():
        found = next((n for n in names if n in hub), None)
        if found is not None:
            corpus[split] = _hub_pairs(hub[found], cfg.src_lang, cfg.tgt_lang, name)
    if "train" not in corpus or "val" not in corpus:
        raise NMTError(f"Hub dataset '{name}' lacks a train or validation split: {list(hub)}")
    return datasets.DatasetDict(corpus)


def _hub_pairs(split: datasets.Dataset, src: str, tgt: str, name: str) -> datasets.Dataset:
    """Bring a Hub split to columns {src, tgt}: from per-language columns or ``translation``."""
    columns = split.column_names
    if src in columns and tgt in columns:
        return split.select_columns([src, tgt]).rename_columns({src: "src", tgt: "tgt"})
    if "translation" in columns:
        return split.map(
            lambda row: {"src": row["translation"][src], "tgt": row["translation"][tgt]},
            remove_columns=columns,
        )
    raise NMTError(f"Hub dataset '{name}' has no columns for {src} and {tgt}: {columns}")
