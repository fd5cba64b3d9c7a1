"""Reading text files in blocks, and checking them: a corpus' plain-text files (a sentence a
line, ``.gz`` too) and a dataset's delimited files (``RowFiles``, as datasets reads them);
and what identifies a file's content for the caches (``file_identity``).

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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import datasets
import huggingface_hub
import numpy as np
from datasets.utils.file_utils import xopen
from fsspec.utils import infer_compression

from nmt.errors import NMTError
from nmt.files import GZIP_ERRORS, open_bytes, what_it_is

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
    reader, 1.5-2 s for 1M lines (190 MB; both on an AMD EPYC Zen 5). Once per read of a
    split, none at a start that finds it prepared. A file is read here as datasets reads it
    (``open_as_datasets``), a Hub file from the copy datasets downloaded; one it streams
    (``data.hub_streaming``) or one elsewhere on the web is not checked: that would download
    it twice."""
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


# A file's resolved path, size, modification time (ns) and content_sample
FileIdentity = tuple[str, int, int, str]


def file_identity(path: str) -> FileIdentity:
    """What identifies a file's content for the caches: its resolved path, size, modification
    time and ``content_sample`` (not its inode or status-change time: a copy staged with
    ``rsync -a`` is the same corpus)."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return str(resolved), stat.st_size, stat.st_mtime_ns, content_sample(resolved)


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
