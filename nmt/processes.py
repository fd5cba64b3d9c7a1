"""The processes a command starts: how they end with it, and how their end is told."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


CELL_PARENT = "NMT_COMPARE_PID"  # set by nmt compare for a cell's training: the pid it ends with
RANK_PARENT = "NMT_TRAIN_PID"  # set by nmt train for the DDP processes Lightning's launcher starts


def die_with_parent(parent: int | None = None, signum: int = signal.SIGKILL) -> None:
    """This process gets ``signum`` (by default SIGKILL) when its parent ends, the OOM
    killer's SIGKILL or ``kill -9`` included, which no handler of the parent's can pass on.
    ``parent``: the id of the process that started this one; where that one ended before the
    signal was armed (it then never comes: this process was handed to another parent), this
    one gets it now. Linux's prctl; elsewhere nothing. The signal comes when the parent's
    *thread* that started this process ends: callers start it from a thread that waits for it."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signum)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)  # as the armed signal would have


@contextmanager
def named_to_children(variable: str) -> Iterator[None]:
    """This process's id in environment variable ``variable`` while the block runs, for the
    processes started meanwhile (they copy the environment) to end with it, by
    ``die_with_parent``'s check also where it ended before they armed prctl."""
    os.environ[variable] = str(os.getpid())
    try:
        yield
    finally:
        del os.environ[variable]


def how_it_ended(exitcode: int) -> str:
    """A process's end in words, from its exit code (-N: killed by signal N, as
    ``subprocess`` and ``multiprocessing`` give it)."""
    if exitcode >= 0:
        return f"exit status {exitcode}"
    name = signal.Signals(-exitcode).name
    return f"killed by {name}" + (": out of memory?" if name == "SIGKILL" else "")  # OOM killer's
