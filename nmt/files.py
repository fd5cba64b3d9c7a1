"""Atomic writes (a file is either its old self or completely the new one), processes
building one folder taking turns, reading a file's bytes whether it is gzipped or not, and
telling a CTranslate2 export from a training run."""

from __future__ import annotations

import fcntl
import gzip
import os
import shutil
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from nmt.errors import NMTError, stop_signals_deferred

# What reading a truncated .gz, or a file named .gz that is not gzip, raises part of the way
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


# How files that are not UTF-8 text begin, for an error that says what the file is: a corpus
# downloaded compressed (WMT's and OPUS's come as .xz, .bz2, .zst or .gz) or saved as UTF-16
# (Windows editors' "Unicode") was "line 1: not valid UTF-8 (byte 0 of the line)"
SIGNATURES = {b"\x1f\x8b": "gzip-compressed", b"BZh": "bzip2-compressed",
              b"\xfd7zXZ\x00": "xz-compressed", b"\x28\xb5\x2f\xfd": "zstd-compressed",
              b"PK\x03\x04": "a zip archive", b"\xff\xfe": "UTF-16 text", b"\xfe\xff": "UTF-16 text"}


def what_it_is(head: bytes, stdin: bool = False) -> str:
    """``"; it is xz-compressed: ..."``, what the first bytes of a file (or of ``stdin``) that
    is not UTF-8 say it is and what to do, for its error message; ``""`` where they say
    nothing."""
    kind = next((kind for sign, kind in SIGNATURES.items() if head.startswith(sign)), None)
    if kind is None:
        return ""
    if kind.startswith("UTF-16"):
        return f"; it is {kind}: convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)"
    if stdin:  # no name to give: decompressed on its way in
        return f"; it is {kind}: decompress it into the pipe (zcat, xzcat, bzcat, zstdcat)"
    if kind.startswith("gzip"):  # read as such by its name only
        return f"; it is {kind}: give it a name ending in .gz to have it read, or decompress it"
    return f"; it is {kind}, which is not read: decompress it, or gzip it (.gz files are read)"


def open_bytes(path: str) -> BinaryIO:
    """A file for reading its bytes, ``.gz`` decompressed (reads may raise ``GZIP_ERRORS``)."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to, renamed over ``path`` when the block ends
    without error; removed otherwise, with the folders made for it, so no half-written file
    (nor an empty folder) is left behind. A file replaced keeps its permission bits, as one
    written in place would. A symbolic link is written through (its target is replaced, the
    link kept); a pipe or a device (``/dev/stdout``, ``/proc/self/fd/1``: the process' own
    streams, whatever they lead to) is written in place, as it cannot be replaced."""
    path = Path(path)
    if path.is_dir():
        raise NMTError(f"output {path} is a directory")
    streams = str(path.absolute()).startswith(("/dev/", "/proc/"))
    if streams or (path.exists() and not path.is_file()):  # where a link leads: a pipe, a device
        try:
            yield path
        except OSError as err:
            raise NMTError(f"cannot write {path}: {err.strerror}") from None
        return
    if path.is_symlink():
        try:
            path = path.resolve()
        except (RuntimeError, OSError):  # by Python version
            raise NMTError(f"cannot write {path}: a loop of symbolic links") from None
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    if file := next((p for p in path.parents if p.exists() and not p.is_dir()), None):
        raise NMTError(f"cannot write {path}: {file} is a file, not a folder")  # mkdir: "exists"
    # A failed write into a new a/b/out left a/b behind, empty: gone with the file
    with made_folders_removed_on_failure(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            # The file replaced keeps its permissions: a private (600) output became readable
            # by all (644, the umask's) otherwise. Tried, not checked first: a file removed
            # since (by another process) is simply a new one.
            with suppress(FileNotFoundError):
                shutil.copymode(path, tmp)
            os.replace(tmp, path)
        except OSError as err:
            raise NMTError(f"cannot write {path}: {err.strerror}") from None
        finally:
            with suppress(OSError):  # where the folder could not be made, there is no file either
                tmp.unlink(missing_ok=True)


@contextmanager
def made_folders_removed_on_failure(path: Path) -> Iterator[None]:
    """The block, after which the folders missing above ``path`` when it began (made for
    ``path`` in it) are removed again, while empty, if it fails: a failed write into a new
    ``a/b/c`` left ``a/b`` behind."""
    made = [folder for folder in path.parents if not folder.exists()]
    try:
        yield
    except BaseException:
        remove_empty(made)
        raise


def remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (innermost first) while they are empty. One that is not (something
    else written there since) is left, without an error in place of the one that ended the
    work they were made for."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@contextmanager
def one_build_at_a_time(folder: Path) -> Iterator[None]:
    """Hold the kernel's lock (``flock``) on ``<folder>.lock`` beside ``folder``: processes
    preparing the same folder at once (two trainings started together, ``compare --jobs``; a
    DDP run's ranks loading a local dataset folder into datasets' cache) take turns, and the
    later ones find it built. Each built it whole before, side by side:
    2 x 300,000 pairs took 45 s each instead of 15 s, with a GB of memory each. A file system
    without locks (some network ones) prepares unguarded, as before.

    The lock file is removed when done, so that ``prepared/`` holds only folders: a process
    that then opens a new one may build beside one still holding the old one (after a failed
    build), which is no worse than before, as a folder is renamed into place whole."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = folder.with_name(f"{folder.name}.lock")
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process preparing {folder} ...", file=sys.stderr,
                  flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            pass
        try:
            yield
        finally:  # before the lock goes, with the file's closing
            with suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino:  # not a newer one's
                    path.unlink()


def save_atomic(obj: object, path: str | Path) -> None:
    """``torch.save`` through ``atomic_path``: a failed write (a full disk, a file size
    limit) is a one-line error naming its cause, and leaves no half-written file. A stop
    (SIGTERM, Ctrl-C) during the save is taken once it is done, then removes the file: its
    handler, raising wherever the process was (at the start of a write torch calls back,
    say), was swallowed into torch's own check, and a run stopped by SIGTERM said "cannot
    write .../step2.ckpt: [enforce fail ...] unexpected pos 30 vs 0"."""
    import torch  # here: the CLI's parsing imports this module (nmt.config), and no torch

    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        writer = WriteErrorKept(file)
        try:
            with stop_signals_deferred():
                torch.save(obj, writer)
        except RuntimeError as err:
            if writer.error is not None:  # the write's own error, which atomic_path reports
                raise writer.error from None
            # an object torch cannot save
            raise NMTError(f"cannot write {path}: {str(err).splitlines()[0]}") from None


class WriteErrorKept:
    """A binary file for ``torch.save`` that keeps the first exception of its writes. Given a
    path, or a file whose write fails, torch reports its own check instead ("[enforce fail
    at inline_container.cc:672] . unexpected pos 64 vs 0"), the cause (a full disk, a file
    size limit) lost."""

    def __init__(self, file: BinaryIO):
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except Exception as err:  # OSError: a full disk, a size limit
            self.error = self.error or err
            raise

    def flush(self) -> None:
        self.file.flush()


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def is_export(folder: str | Path) -> bool:
    """Whether ``folder`` holds a CTranslate2 model (the ``model.bin`` nmt export writes)."""
    return (Path(folder) / "model.bin").is_file()


def require_export(folder: str | Path) -> None:
    """A one-line error where ``--engine ctranslate2`` is given a folder that is no export."""
    if not is_export(folder):
        raise NMTError(f"no CTranslate2 model in {folder}: --engine ctranslate2 takes a "
                       "folder written by nmt export (of a Transformer run), e.g. nmt export "
                       "--checkpoint RUN --out RUN.ct2")


def refuse_export(folder: str | Path, hint: str) -> None:
    """A one-line error where a training run is needed and ``folder`` is an export: a user
    who named one is told what to do instead (``hint``) rather than that files are missing."""
    if is_export(folder):
        raise NMTError(f"{folder} is a CTranslate2 export: {hint}")
