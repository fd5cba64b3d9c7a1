"""Memory figures and atomic writes: what a process reports is its own, and a write that
fails leaves the old file and no temporary one."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch

from nmt.errors import NMTError
from nmt.files import atomic_path, save_atomic, write_atomic
from nmt.memory import peak_memory_mb, resident_memory_mb
from nmt.trainer import AtomicCheckpointIO


def test_a_child_process_reports_its_own_peak_not_its_parents():
    """getrusage's ru_maxrss would carry this process's peak into the child (Linux keeps it
    through fork and exec): the child of a process holding 300 MB more would report that."""
    held = bytearray(300 * 2**20)  # touched: zero-filled pages are resident after the write
    held[:: 4096] = b"x" * len(held[:: 4096])
    parent = peak_memory_mb()
    child = subprocess.run([sys.executable, "-c", "from nmt.memory import peak_memory_mb; "
                            "print(peak_memory_mb())"], capture_output=True, text=True, check=True)
    assert parent > 300
    assert float(child.stdout) < parent - 250
    assert resident_memory_mb() <= peak_memory_mb()


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("this object cannot be saved")


def test_a_checkpoint_that_cannot_be_written_leaves_the_old_one_and_no_temporary_file(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, path)
    assert torch.load(path, weights_only=True) == {"step": 1}
    # fails inside torch.save, which reports failed writes as RuntimeErrors too: one line
    with pytest.raises(NMTError, match="cannot write .*last.ckpt: this object cannot be saved"):
        AtomicCheckpointIO().save_checkpoint({"step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_text_that_cannot_be_written_is_a_one_line_error(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    with pytest.raises(NMTError, match="cannot write .*out.txt"):
        write_atomic(tmp_path / "blocker" / "out.txt", "text")
    write_atomic(tmp_path / "out.txt", "old")
    with pytest.raises(NMTError, match="is a directory"):
        write_atomic(tmp_path, "text")
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["blocker", "out.txt"]


def test_a_failed_write_leaves_no_folder_it_made(tmp_path):
    """A write into folders that did not exist yet, failing (a full disk, an object torch
    cannot save), removed its half-written file but left the empty folders made for it
    (out/a/b); they are removed too now, and a folder that existed before is kept."""
    (tmp_path / "out").mkdir()
    with pytest.raises(NMTError, match="cannot write .*last.ckpt: this object cannot be saved"):
        save_atomic({"bad": Unpicklable()}, tmp_path / "out" / "a" / "b" / "last.ckpt")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not any((tmp_path / "out").iterdir())
    (tmp_path / "out" / "kept").mkdir()  # a made folder that is not empty stays, without an error
    with pytest.raises(ValueError, match="stopped"), atomic_path(tmp_path / "out" / "x" / "f") as tmp:
        (tmp.parent / "other").write_text("written meanwhile")
        raise ValueError("stopped")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["kept", "x"]
    assert [p.name for p in (tmp_path / "out" / "x").iterdir()] == ["other"]


def test_a_file_replaced_keeps_its_permissions(tmp_path):
    """A private output (chmod 600: nmt translate --output, say) stayed private only until it
    was written again: the new file, renamed over it, had the umask's 644."""
    private, new = tmp_path / "private.txt", tmp_path / "new.txt"
    private.write_text("old")
    private.chmod(0o600)
    write_atomic(private, "new")
    write_atomic(new, "new")
    assert private.read_text() == "new" and stat.S_IMODE(private.stat().st_mode) == 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask  # a new file: as open() makes it


def test_a_file_removed_while_it_is_replaced_is_written_anew(tmp_path, monkeypatch):
    """The file replaced removed by another process between the check that it exists and the
    copy of its permissions: "cannot write FILE: No such file or directory", for a file that
    could be written (it is then a new one, with the umask's mode)."""
    path = tmp_path / "out.txt"
    path.write_text("old")
    copymode = shutil.copymode

    def removed_first(source, target, **options):
        path.unlink(missing_ok=True)
        return copymode(source, target, **options)

    monkeypatch.setattr(shutil, "copymode", removed_first)
    write_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left
