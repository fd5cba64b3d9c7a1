"""The one exception type the command line turns into a one-line message, and how signals
end a command."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn


class NMTError(Exception):
    """A user-facing error: bad input, missing files, unknown names. No traceback is shown."""


def echoed(text: str, limit: int = 60) -> str:
    """What a user gave, as an error repeats it: on one line (line breaks escaped), and at
    most ``limit`` characters, so that a field of a megabyte, or the 301 digits of 1e300 as an
    integer, cannot swamp the one line (or a server's 400) that says what was wrong."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class UsageError(NMTError):
    """A command line the parser could not take (an unknown option, an argument too many):
    exit status 2, as argparse's own refusals, where an error in what it asked is 1."""


class Stopped(KeyboardInterrupt):
    """A signal other than Ctrl-C's (SIGTERM, SIGHUP) raised as an interrupt, so that what is
    half-written is cleaned up as for Ctrl-C; the command then exits 128 + its number, as the
    signal's default would (a shell's or scheduler's reading of the status)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def raise_stopped(signum: int, frame: object) -> NoReturn:
    """The handler that makes a signal ``Stopped`` (``nmt.cli.sigterm_as_interrupt``)."""
    raise Stopped(signum)


def interrupt_behind(err: BaseException) -> KeyboardInterrupt | None:
    """The interrupt (Ctrl-C, or a signal raised as ``Stopped``) that ``err`` was raised while
    handling, if any. A handler raises wherever the process is, inside a library too, and the
    library's clean-up on the way out may fail on its half-built state and raise its own
    error in place of the interrupt (OmegaConf: "AttributeError: 'NoneType' object has no
    attribute '_invalidate_flags_cache'"): a stopped command then ended in that traceback.
    An exception raised while the interrupt propagated, or while it was being handled (its
    ``except`` and ``finally`` blocks), keeps it in its chain (``__context__``, kept even under
    ``raise ... from None``); one raised once its handling is over does not. So a clean-up
    that fails as a stop goes through is reported as the stop; and an ``except
    KeyboardInterrupt`` block that means to say more raises a KeyboardInterrupt with the
    message (as ``nmt.training.fit`` does), not another exception."""
    seen: set[int] = set()
    chain: list[BaseException | None] = [err]
    while chain:
        link = chain.pop()
        if link is None or id(link) in seen:
            continue
        if isinstance(link, KeyboardInterrupt):
            return link
        seen.add(id(link))
        chain += [link.__cause__, link.__context__]
    return None


@contextmanager
def stop_signals_by_default() -> Iterator[None]:
    """The signals that ``raise_stopped`` takes back to their default while the block runs:
    code that sets its own handlers (Lightning's, for a stop at the next batch) or blocks in
    C++ (DDP's rendezvous, where a Python handler waits for it to return: up to its
    30-minute timeout) stops there as it did before the command took them."""
    taken = [sig for sig in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) is raise_stopped
             and threading.current_thread() is threading.main_thread()]  # where Python sets them
    for sig in taken:
        signal.signal(sig, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig in taken:
            signal.signal(sig, raise_stopped)


@contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held while the block runs, then taken by their handlers as
    they arrived: for a step that a stop must not cut in two. Starting a process is one: a
    stop between its spawn and the hand-over of its arguments left it running on alone,
    unknown to the code that stops it (it printed an EOFError traceback)."""
    signals = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
               if callable(signal.getsignal(sig))  # Python's handlers; not SIG_DFL, SIG_IGN, C's
               and threading.current_thread() is threading.main_thread()]
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])  # the first stop, now: its handler raises here


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """Run a script's ``main`` (scripts/) and exit with its status, an ``NMTError`` (a config or
    run directory not found) as the command line has it: one line on stderr, status 1, where
    the scripts ended in the error's traceback."""
    try:
        status = main()
    except NMTError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    sys.exit(status)


def first_line(err: BaseException) -> str:
    """What a one-line message quotes of a library's exception: its message's first line, or
    its type's name where it has none."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__


@contextmanager
def stopped_cleanly() -> Iterator[None]:
    """SIGTERM as Ctrl-C while the block runs, and either one the block's clean end: a server's
    stop (systemd, Kubernetes: SIGTERM) is its normal end, exit status 0, as LitServe ends once
    it serves."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    except BaseException as err:
        if interrupt_behind(err) is None:  # else the stop, or an error raised as it went by
            raise
    finally:
        signal.signal(signal.SIGTERM, previous)  # for a caller in the same process
