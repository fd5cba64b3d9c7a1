"""Atomic text writes: a file is either its old self or completely the new one."""

from __future__ import annotations

import os
from pathlib import Path

from nmt.errors import NMTError


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    if path.is_dir():
        raise NMTError(f"output {path} is a directory")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise NMTError(f"cannot write {path}: {err.strerror}") from None
