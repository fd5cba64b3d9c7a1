"""Parallel corpora: where each split's sentence pairs come from, and reading them safely.

Three sources, tried in this order:
1. plain-text files the user names (``data.train_files`` = [source, target], ...);
2. unless ``data.hub_dataset`` is set, a local folder in the Multi30k layout:
   ``<data_dir>/<corpus>/{train,val,test_2016_flickr}.<lang>[.gz]``;
3. a Hugging Face Hub dataset (``bentrevett/multi30k`` for multi30k, or ``data.hub_dataset``),
   either with one column per language or with a ``translation`` column of {lang: text}
   (a tab-separated file a pair a line, its quotes text: ``csv_options``);
   downloaded into the datasets cache, or with ``data.hub_streaming`` read as a stream (WMT
   size: nothing is stored but the prepared ids).

A line of a text file ends at ``\\n`` and nowhere else, as in ``nmt translate``; one ``\\r``
before the ``\\n`` (Windows line ends) is dropped. Any other line break inside a line (``\\r``,
vertical tab, form feed, U+0085, U+2028, U+2029, ...) is an error naming the file and line:
readers that split on those would silently shift every later pair by one.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import itertools
import lzma
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import datasets
import huggingface_hub
import numpy as np
from datasets.exceptions import DatasetGenerationError
from datasets.packaged_modules.csv.csv import CsvConfig
from datasets.utils.file_utils import xopen
from fsspec.utils import infer_compression

from nmt.config import DataConfig
from nmt.errors import NMTError, first_line
from nmt.files import GZIP_ERRORS, open_bytes, what_it_is

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

# What str.splitlines() would also break at, besides "\n": each is refused inside a line.
LINE_BREAKS = {
    "\r": "a carriage return (\\r)", "\x0b": "a vertical tab (\\v)", "\x0c": "a form feed (\\f)",
    "\x1c": "U+001C", "\x1d": "U+001D", "\x1e": "U+001E", "\x85": "U+0085 NEXT LINE",
    "\u2028": "U+2028 LINE SEPARATOR", "\u2029": "U+2029 PARAGRAPH SEPARATOR",
}
_LINE_BREAK = re.compile("[" + "".join(LINE_BREAKS) + "]")
CHUNK_BYTES = 1 << 24  # read text 16 MiB at a time: memory stays flat however big the file


@dataclass(frozen=True)
class RowFiles:
    """A split's delimited text files (a row a line under a header line, a ``.tsv``; or with
    quoted fields, a ``.csv``) as datasets' CSV reader is told to read them (``csv_options``),
    checked when read (``check_rows``)."""

    paths: tuple[str, ...] = ()
    sep: str = "\t"
    quotechar: str | None = None  # None: no quoting, a row a line


@dataclass(frozen=True)
class HubSplit:
    """A downloaded Hub split. Its rows hold one column per language of the pair, in sorted
    order whatever the direction, so that both directions have one fingerprint (the cache's
    key: they share one prepared folder, as two files do); ``src`` and ``tgt`` name the
    columns read as source and target."""

    rows: datasets.Dataset
    src: str
    tgt: str
    row_files: RowFiles = RowFiles()  # checked when read (``check_rows``)


@dataclass(frozen=True)
class HubStream:
    """A Hub split read as a stream: ``nmt prepare`` reads it twice (SentencePiece's sample,
    then the encoding) and never stores it whole. The cache knows it by name, configuration,
    split and version: a stream has no fingerprint of its content."""

    name: str
    config: str | None
    split: str
    rows: datasets.IterableDataset  # a column per language, as HubSplit's
    src: str
    tgt: str
    row_files: RowFiles = RowFiles()  # as HubSplit's


# Two aligned text files, a downloaded Hub split, or a streamed one.
Source = tuple[str, str] | HubSplit | HubStream


@dataclass(frozen=True)
class HubDataset:
    """A Hub dataset whose files are resolved (``resolve_hub``), nothing of it downloaded."""

    builder: datasets.DatasetBuilder  # with the options csv_options gives its files
    row_files: dict[str, RowFiles]  # each split's (by the dataset's names) to check


def split_sources(cfg: DataConfig, needed: tuple[str, ...] = SPLITS,
                  hub: HubDataset | None = None) -> dict[str, Source]:
    """Where each split comes from: named files, the local folder, or the Hub (loaded; from
    ``hub``, where its files are resolved already). Named files must exist for the ``needed``
    splits (evaluating one split of a run needs its files alone, not the training corpus,
    which may be gone)."""
    local = local_sources(cfg, needed)
    return local if local is not None else _from_hub(cfg, hub or resolve_hub(cfg))


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
            f"{_languages_there(local)} and no data.hub_dataset given; point "
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


def read_lines(path: str) -> Iterator[list[str]]:
    """Lines of a UTF-8 text file (``.gz`` too), split on ``\\n`` only, in chunks."""
    for data, done in line_blocks(path):
        if lines := _decode_lines(path, data, done):
            yield lines


def line_blocks(path: str, opener: Opener = open_bytes) -> Iterator[tuple[bytes, int]]:
    """The bytes of a file (see ``read_blocks``) in blocks of whole lines (the last may lack
    its ``\\n``), each with the number of lines before it."""
    done, rest = 0, b""
    for block in itertools.chain(read_blocks(path, opener), [b""]):  # b"": the end, takes the rest
        data = rest + block
        cut = len(data) if not block else data.rfind(b"\n") + 1  # whole lines only
        data, rest = data[:cut], data[cut:]
        if data:
            yield data, done
            done += data.count(b"\n")


# Opens a file to read its bytes: ``open_bytes`` (plain or ``.gz``), or ``open_as_datasets``
Opener = Callable[[str], AbstractContextManager[BinaryIO]]


def read_blocks(path: str, opener: Opener = open_bytes) -> Iterator[bytes]:
    """The bytes of a file (``.gz`` decompressed, or as ``opener`` reads it), in non-empty
    blocks of up to ``CHUNK_BYTES``, less a UTF-8 byte-order mark at its start (Windows
    editors write one: it is not text of the first line)."""
    with opener(path) as f:
        for number in itertools.count():
            try:
                block = f.read(CHUNK_BYTES)
            except (*GZIP_ERRORS, OSError, lzma.LZMAError) as err:  # bz2's is an OSError
                if (kind := infer_compression(path)) is None:
                    raise  # not a decompressor's: the disk's
                raise NMTError(f"{path}: damaged {kind} file ({err})") from None
            if not block:
                return
            if number == 0:
                block = block.removeprefix(codecs.BOM_UTF8)
            if block:
                yield block


def line_count(path: str) -> int:
    """The lines ``read_lines`` reads from a file, counted without decoding them."""
    count, last = 0, b"\n"
    for block in read_blocks(path):
        count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")  # text after the last "\n" is a line too


def _decode_lines(path: str, data: bytes, done: int) -> list[str]:
    """Decode whole lines; ``done`` lines of the file came before (for error messages)."""
    try:
        text = data.decode("utf-8").replace("\r\n", "\n")  # Windows line ends
    except UnicodeDecodeError as err:
        line = done + data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1)  # the chunk's offset: no use
        hint = what_it_is(data) if line == 1 else ""
        raise NMTError(f"{path}, line {line}: not valid UTF-8 (byte {column} of the line){hint}"
                       ) from None
    if found := _LINE_BREAK.search(text):
        raise line_break_error(path, done + text.count("\n", 0, found.start()) + 1, found.group())
    lines = text.split("\n")
    if lines[-1] == "":  # text after the last "\n" is a line only if not empty
        lines.pop()
    return lines


def line_break_error(path: str, line: int, char: str) -> NMTError:
    """The error for a line break ``char`` (one of ``LINE_BREAKS``) inside a line of a file."""
    return NMTError(f"{path}, line {line}: {LINE_BREAKS[char]} inside the line; lines end at "
                    r"\n only, so pairs would shift: replace it with a space")


def open_as_datasets(path: str) -> AbstractContextManager[BinaryIO]:
    """A dataset's local file, decompressed as datasets' readers decompress it (gzip, bzip2,
    xz, ... as its name says)."""
    return xopen(datasets.StreamingDownloadManager().extract(path), "rb")


def check_rows(files: RowFiles) -> None:
    """A one-line error naming the first line of a split's delimited files (``RowFiles``)
    that pandas would not read as one whole row, silently:

    * a carriage return other than one before the line's ``\\n`` (outside a quoted field):
      pandas ends a line there too, which cut the row in two, a sentence with an empty side
      and a pair of halves;
    * a row with fewer separators than the header line: pandas fills the missing fields with
      empty text, and the pair was left out as one with an empty side, where the file is
      malformed (a sentence broken over two lines leaves two such lines). Marian refuses such
      a line of its TSV input, as fairseq and OpenNMT refuse misaligned files; a row with a
      field too many pandas refuses itself. A blank line is no row for pandas, and none here.

    A row a line (a ``.tsv`` file) is counted vectorised (numpy), as pandas reads: 0.3-0.45 s
    for 1M lines (176 MB), about a fifth of datasets' first load of them; a quoted one (a
    ``.csv`` file, whose quoted fields may hold separators and line breaks) by Python's CSV
    reader, 1.5-2 s for 1M lines (190 MB). Once per read of a split, none at a start that
    finds it prepared. A file is read here as datasets reads it (``open_as_datasets``), a Hub file
    from the copy datasets downloaded; one it streams (``data.hub_streaming``) or one
    elsewhere on the web is not checked: that would download it twice."""
    rows = _quoted_rows if files.quotechar else _unquoted_rows
    for path in files.paths:
        if (copy := _local_copy(path)) is None:
            continue
        header = None
        for lines, separators, lone in rows(copy, files):
            if header is None and len(separators):
                header = int(separators[0])
            short = np.flatnonzero(separators < header) if header is not None else []
            if lone is not None and (not len(short) or lone <= lines[short[0]]):
                raise line_break_error(path, lone, "\r")
            if len(short):
                line, found = int(lines[short[0]]), int(separators[short[0]])
                name = SEPARATOR_NAMES.get(files.sep, f"'{files.sep}'")
                raise NMTError(f"{path}, line {line}: {found} {name}{'s' * (found != 1)} where the "
                               f"header line has {header}: each line holds a whole pair (a "
                               f"sentence broken over two lines, or a {name} lost?)")


# Each block's rows of a delimited file: (the line each starts at, its separators outside
# quotes, the line of the first lone carriage return or None), blank lines left out
Rows = Iterator[tuple[np.ndarray, np.ndarray, int | None]]


def _unquoted_rows(path: str, files: RowFiles) -> Rows:
    """The rows of a file of a row a line, counted in blocks of bytes (numpy)."""
    sep = ord(files.sep)
    for data, done in line_blocks(path, open_as_datasets):
        text = np.frombuffer(data, np.uint8)
        ends = np.flatnonzero(text == ord("\n"))
        starts = np.concatenate(([0], ends + 1))[:len(ends) + (text[-1] != ord("\n"))]
        stops = np.append(ends, len(text))[:len(starts)]
        separators = np.bincount(np.searchsorted(ends, np.flatnonzero(text == sep)),
                                 minlength=len(starts))
        returns = np.flatnonzero(text == ord("\r"))
        # the byte after each; the file's last byte's own where it is the last
        after = text[np.minimum(returns + 1, len(text) - 1)]
        lone = np.searchsorted(ends, returns[after != ord("\n")])  # the lines they are in
        blank = (stops == starts) | ((stops == starts + 1) & (text[starts] == ord("\r")))
        rows = np.flatnonzero(~blank)
        yield done + rows + 1, separators[rows], done + int(lone[0]) + 1 if len(lone) else None


def _quoted_rows(path: str, files: RowFiles) -> Rows:
    """The rows of a file whose fields may be quoted, as Python's CSV reader (which reads
    quotes as pandas' does) parses them, in blocks of ``ROW_BLOCK`` rows."""
    reader = csv.reader(_text_lines(path), delimiter=files.sep, quotechar=files.quotechar)
    lines, separators, lone, done = [], [], None, 0
    try:
        for row in reader:
            if row:  # a blank line is no row
                lines.append(done + 1)
                separators.append(len(row) - 1)
            done = reader.line_num
            if len(lines) == ROW_BLOCK:
                yield np.array(lines), np.array(separators), None
                lines, separators = [], []
    except csv.Error as err:  # its other errors (a field over its size limit) pandas reports
        if "new-line character" in str(err):  # a lone \r outside quotes
            lone = reader.line_num
    yield np.array(lines, dtype=int), np.array(separators, dtype=int), lone


ROW_BLOCK = 100_000
SEPARATOR_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "bar"}


def _text_lines(path: str) -> Iterator[str]:
    """The lines of a file, split at ``\\n`` alone (a line break elsewhere is the CSV
    reader's to see), without it; bytes that are not UTF-8 are left for datasets' reader to
    report."""
    for data, _ in line_blocks(path, open_as_datasets):
        yield from data.decode("utf-8", "surrogateescape").removesuffix("\n").split("\n")


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
    """What identifies a split's content for the cache: each file's path, size, modification
    time and ``content_sample`` (not its inode or status-change time: a copy staged with
    ``rsync -a`` is the same corpus), a Hub dataset's fingerprint, or a stream's name and
    version. What that cannot see (an edit of a large file between its sampled blocks, its
    size and time kept; a stream revised under its name) ``nmt.data.prepare.check_prepared_text``
    finds in the validation pairs, not in the training split."""
    if isinstance(source, HubSplit):
        return [source.rows._fingerprint]
    if isinstance(source, HubStream):
        info = source.rows.info
        return [f"stream {source.name} {source.config} {source.split} {info.version} {info.dataset_size}"]
    stats = [(Path(p).resolve(), Path(p).stat()) for p in source]
    return [(str(path), st.st_size, st.st_mtime_ns, content_sample(path)) for path, st in stats]


SAMPLE_BLOCKS, SAMPLE_BYTES = 16, 1 << 16  # what content_sample reads: 1 MiB of any file


def content_sample(path: Path) -> str:
    """sha1 of ``SAMPLE_BLOCKS`` blocks of a file, its first, its last and evenly spaced
    between (the whole file where it is no larger). Another text of the same size and
    modification time (``cp -p``, ``touch -r``, a corpus rebuilt by a script that sets its
    times) kept a training file's stale prepared ids, as the size and time were the key:
    its bytes differ in nearly every block, and in a gzip file's last bytes (the CRC32 of
    the text) whatever changed. A millisecond of reading for a file of any size, at each
    start; hashing whole files would cost seconds a gigabyte."""
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
            digest.update(f.read())
        else:
            for block in range(SAMPLE_BLOCKS):
                f.seek((size - SAMPLE_BYTES) * block // (SAMPLE_BLOCKS - 1))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


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


def _languages_there(folder: Path) -> str:
    """" (that folder has en, fr)": the languages of a local folder's training files; "" if none."""
    langs = sorted({match.group(1) for path in folder.glob("train.*")
                    if (match := re.fullmatch(r"train\.([^.]+)(?:\.gz)?", path.name))})
    return f" (that folder has {', '.join(langs)})" if langs else ""


def _existing(stem: Path) -> str | None:
    for path in (stem, stem.with_name(stem.name + ".gz")):
        if path.is_file():
            return str(path)
    return None


def hub_name(cfg: DataConfig) -> str | None:
    """The Hub dataset a corpus is read from where no local files are found (None: none)."""
    return cfg.hub_dataset or HUB_DEFAULTS.get(cfg.corpus)


def resolve_hub(cfg: DataConfig) -> HubDataset:
    """The configured Hub dataset with its files resolved and nothing downloaded (seconds,
    where a first download may take hours): an unreachable Hub or a dataset not found is its
    one-line error here, so that training checks it before its other options and loads it
    after (``_from_hub``). A dataset of CSV or TSV files is resolved twice: once to find that
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
            f"(train|val|test_2016_flickr).<lang>[.gz]{_languages_there(local)} and the Hub "
            f"dataset '{name}' could not be loaded: {_reason(err)}. Put the files there or set "
            "data.train_files/data.val_files."
        ) from None


def _from_hub(cfg: DataConfig, hub: HubDataset) -> dict[str, Source]:
    """The splits of a resolved Hub dataset: downloaded (into datasets' cache, once), or
    opened as streams."""
    name = hub_name(cfg)
    with _hub_errors(cfg):  # as datasets.load_dataset loads
        if cfg.hub_streaming:
            splits = hub.builder.as_streaming_dataset()
        else:
            hub.builder.download_and_prepare()
            splits = hub.builder.as_dataset()
    corpus = {}
    for split, names in HUB_SPLITS.items():
        found = next((n for n in names if n in splits), None)
        if found is not None:
            src, tgt = cfg.src_lang, cfg.tgt_lang
            with stream_errors(name) if cfg.hub_streaming else nullcontext():  # reads its first rows
                rows = _language_columns(splits[found], src, tgt, name)
            files = hub.row_files.get(found, RowFiles())
            corpus[split] = HubStream(name, cfg.hub_config, found, rows, src, tgt, files) \
                if cfg.hub_streaming else HubSplit(rows, src, tgt, files)
    if "train" not in corpus or "val" not in corpus:
        raise NMTError(f"Hub dataset '{name}' lacks a train or validation split: {list(splits)}")
    return corpus


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


# A Hub dataset's file as datasets names it: hf://datasets/<owner>/<name>@<revision>/<path>
HUB_FILE = re.compile(r"hf://datasets/(?P<repo>[^/@]+/[^/@]+)@(?P<revision>[^/]+)/(?P<path>.+)")


def _local_copy(path: str) -> str | None:
    """A dataset's file on this machine: a local one, or the copy of a Hub file that datasets
    downloaded (in the Hub's cache; found without asking the Hub); None where there is none
    (streamed, or elsewhere on the web)."""
    if Path(path).is_file():
        return path
    if hub_file := HUB_FILE.fullmatch(path):
        copy = huggingface_hub.try_to_load_from_cache(hub_file["repo"], hub_file["path"],
                                                      revision=hub_file["revision"],
                                                      repo_type="dataset")
        return copy if isinstance(copy, str) else None  # or a marker: known to be missing
    return None


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
