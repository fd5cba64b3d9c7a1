"""Parallel corpora: where each split's sentence pairs come from, and reading them safely.

Three sources, tried in this order:
1. plain-text files the user names (``data.train_files`` = [source, target], ...);
2. unless ``data.hub_dataset`` is set, a local folder in the Multi30k layout:
   ``<data_dir>/<corpus>/{train,val,test_2016_flickr}.<lang>[.gz]``;
3. a Hugging Face Hub dataset (``bentrevett/multi30k`` for multi30k, or ``data.hub_dataset``),
   resolved, downloaded or streamed by ``nmt.data.hub``.

A text file's lines are read as ``nmt.data.text_files`` reads them: split at ``\\n`` alone,
a line break elsewhere in a line an error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from pathlib import Path

import datasets

from nmt.config import DataConfig
from nmt.data.hub import (
    HubDataset,
    HubSplit,
    HubStream,
    from_hub,
    hub_name,
    languages_there,
    resolve_hub,
    stream_errors,
)
from nmt.data.text_files import check_rows, file_identity, line_count, read_lines
from nmt.errors import NMTError

SPLITS = ("train", "val", "test")
# Local file stems of each split, first match wins (Multi30k names its test set by year).
LOCAL_STEMS = {
    "train": ("train",),
    "val": ("val", "valid", "dev"),
    "test": ("test_2016_flickr", "test"),
}


# Two aligned text files, a downloaded Hub split, or a streamed one.
Source = tuple[str, str] | HubSplit | HubStream


def split_sources(cfg: DataConfig, needed: tuple[str, ...] = SPLITS,
                  hub: HubDataset | None = None) -> dict[str, Source]:
    """Where each split comes from: named files, the local folder, or the Hub (loaded; from
    ``hub``, where its files are resolved already). Named files must exist for the ``needed``
    splits (evaluating one split of a run needs its files alone, not the training corpus,
    which may be gone)."""
    local = local_sources(cfg, needed)
    return local if local is not None else from_hub(cfg, hub or resolve_hub(cfg))


def local_sources(cfg: DataConfig, needed: tuple[str, ...] = SPLITS) -> dict[str, Source] | None:
    """The splits' files where the corpus is local (named files, or the local folder), None
    where it is to come from the Hub; a one-line error where it is neither. Loads nothing,
    so that training checks it before anything else is said."""
    if cfg.train_files or cfg.val_files or cfg.test_files:
        return _named_files(cfg, needed)
    if cfg.hub_dataset is None and (local := local_files(cfg)) is not None:
        return local
    if hub_name(cfg) is None:
        local = Path(cfg.data_dir) / cfg.corpus
        raise NMTError(
            f"corpus '{cfg.corpus}' not found: no {local}/train.{cfg.src_lang}[.gz] etc."
            f"{languages_there(local)} and no data.hub_dataset given; point "
            "data.train_files/data.val_files at local files"
        )
    return None


def test_set_name(cfg: DataConfig) -> str:
    """The test split's name as a report gives it: its reference file's name, or the Hub
    dataset (and configuration) whose test split it is. For a corpus that has a test split
    (what was scored on one)."""
    local = local_sources(cfg, needed=("test",))
    if local is None:
        return f"the test split of {' '.join(filter(None, (hub_name(cfg), cfg.hub_config)))}"
    return Path(local["test"][1]).name


def read_pairs(source: Source, limit: int | None = None) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned chunks (sources, targets) of a split, at most ``limit`` pairs in all."""
    if isinstance(source, (HubSplit, HubStream)):
        check_rows(source.row_files)  # here, where they are read: not at each run's start
        chunks = _dataset_chunks(source.rows, source.src, source.tgt)
    else:
        chunks = _file_pairs(*source)
    left = limit if limit is not None else float("inf")
    with stream_errors(source.name) if isinstance(source, HubStream) else nullcontext():
        for src, tgt in chunks:
            if left < len(src):
                src, tgt = src[: int(left)], tgt[: int(left)]
            left -= len(src)
            yield src, tgt
            if left <= 0:
                if isinstance(source, tuple):  # files read in part: their lengths still must agree
                    check_same_length(*source, *map(line_count, source))
                return


class Corpus(Mapping):
    """Splits as ``datasets.Dataset`` of {src, tgt}, each read when first asked for."""

    def __init__(self, sources: dict[str, Source], train_lines: int | None):
        self.sources, self.train_lines, self._loaded = sources, train_lines, {}

    def __getitem__(self, split: str) -> datasets.Dataset:
        if split not in self._loaded:
            limit = self.train_lines if split == "train" else None
            src, tgt = [], []
            for s, t in read_pairs(self.sources[split], limit):
                src += s
                tgt += t
            self._loaded[split] = datasets.Dataset.from_dict({"src": src, "tgt": tgt})
        return self._loaded[split]

    def __iter__(self):
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)


def load_corpus(cfg: DataConfig, needed: tuple[str, ...] = SPLITS) -> Corpus:
    """The configured corpus; ``train`` is cut to ``cfg.train_lines`` if set. Named files
    must exist for the ``needed`` splits (see ``split_sources``)."""
    return Corpus(split_sources(cfg, needed), cfg.train_lines)


def _file_pairs(src_path: str, tgt_path: str) -> Iterator[tuple[list[str], list[str]]]:
    """Equal-length chunks of two files' lines; files of different lengths are an error."""
    readers = [read_lines(src_path), read_lines(tgt_path)]
    buffers: list[list[str]] = [[], []]
    counts, finished = [0, 0], [False, False]
    while not all(finished):
        side = 1 if finished[0] else 0 if finished[1] else int(len(buffers[1]) < len(buffers[0]))
        chunk = next(readers[side], None)
        if chunk is None:
            finished[side] = True
            continue
        counts[side] += len(chunk)
        if finished[1 - side]:  # the other file has ended: only count what is left
            continue
        buffers[side] += chunk
        if n := min(map(len, buffers)):
            yield buffers[0][:n], buffers[1][:n]
            del buffers[0][:n], buffers[1][:n]
    check_same_length(src_path, tgt_path, *counts)


def check_same_length(src_path: str, tgt_path: str, src_lines: int, tgt_lines: int) -> None:
    """A one-line error where a corpus' two sides differ in length: pairs would not align."""
    if src_lines != tgt_lines:
        raise NMTError(f"{src_path} has {src_lines} lines but {tgt_path} has {tgt_lines}; "
                       "the two sides of a corpus must align line by line")


def _dataset_chunks(split: datasets.Dataset | datasets.IterableDataset, src: str, tgt: str
                    ) -> Iterator[tuple[list[str], list[str]]]:
    """A Hub split's (``src`` column, ``tgt`` column) in chunks; a missing side (null) is an
    empty line, which training leaves out as it does an empty line of a file."""
    done = 0
    for rows in split.iter(batch_size=10_000):
        sides = [["" if text is None else text for text in rows[side]] for side in (src, tgt)]
        for side, texts in zip(("source", "target"), sides):
            bad = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
            if bad is not None:
                raise NMTError(f"row {done + bad + 1} of a Hub split holds {texts[bad]!r} as its "
                               f"{side}, not text")
        done += len(sides[0])
        yield sides[0], sides[1]


def source_identity(source: Source) -> list:
    """What identifies a split's content for the cache: each file's ``file_identity`` (path,
    size, modification time and a sample of its bytes), a Hub dataset's fingerprint (with a
    local dataset folder's files' identity: ``HubSplit``), or a stream's name and version
    (with a local dataset folder's files' identity). What that cannot see (an edit of a large
    file between its sampled blocks, its size and time kept; a Hub stream revised under its
    name) ``nmt.data.prepare.check_prepared_text`` finds in the validation pairs, not in the
    training split."""
    if isinstance(source, tuple):
        return [file_identity(path) for path in source]
    if isinstance(source, HubSplit):
        key = source.rows._fingerprint
    else:
        info = source.rows.info
        key = f"stream {source.name} {source.config} {source.split} {info.version} {info.dataset_size}"
    # one entry: a dataset holds both sides
    return [[key, *source.local_files] if source.local_files else key]


def _named_files(cfg: DataConfig, needed: tuple[str, ...]) -> dict[str, Source]:
    files = {}
    for split in SPLITS:
        pair = getattr(cfg, f"{split}_files")
        if pair is None:
            continue
        if len(pair) != 2:
            raise NMTError(f"data.{split}_files needs two paths [source, target], got {pair}")
        for path in pair if split in needed else ():
            if Path(path).is_dir():
                raise NMTError(f"data.{split}_files: {path} is a folder, not a file")
            if not Path(path).is_file():
                raise NMTError(f"data.{split}_files: no such file: {path}")
        check_file_languages(f"data.{split}_files", pair, cfg.src_lang, cfg.tgt_lang)
        files[split] = (str(pair[0]), str(pair[1]))
    if "train" not in files or "val" not in files:
        raise NMTError("named files replace the whole corpus: data.train_files and data.val_files "
                       "are both required with them (data.test_files is optional)")
    return files


def check_file_languages(what: str, pair, src_lang: str, tgt_lang: str) -> None:
    """A one-line error where two files given as [source, target] end in the pair's language
    codes the other way round ([train.en, train.de] for de->en, as after flipping
    --src-lang/--tgt-lang alone): read as given, a run learns the reverse direction under the
    pair's name, and evaluate scores translations against the source text, silently. ``what``
    names the option: a command line's (``--files``, two arguments) is shown as typed."""
    if [file_language(path) for path in pair] == [tgt_lang, src_lang]:
        if what.startswith("--"):
            given, order = f"{what} {pair[0]} {pair[1]}", f"{what} {pair[1]} {pair[0]}"
        else:
            names = [Path(path).name for path in pair]
            given, order = f"{what} [{names[0]}, {names[1]}]", f"[{names[1]}, {names[0]}]"
        raise NMTError(f"{given} is [source, target], but their names say {tgt_lang}->{src_lang}, "
                       f"the reverse of {src_lang}->{tgt_lang}: give {order}")


def file_language(path: str) -> str:
    """The language code a corpus file's name ends with: train.de and train.de.gz -> de."""
    return Path(Path(path).name.removesuffix(".gz")).suffix.removeprefix(".")


def local_files(cfg: DataConfig) -> dict[str, Source] | None:
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
