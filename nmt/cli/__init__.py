"""Command line: ``nmt train | prepare | translate | evaluate | average | compare | bench | serve | export``.

Thin: parse, call, print. Errors a user can fix (bad input, missing files, unknown names)
end with one line on stderr and exit status 1, never a traceback. Each command is two
functions in one of the modules here: ``add_<command>`` builds its parser, naming
``cmd_<command>``, which runs it. Parsing imports no torch: the commands import what they
need when they run.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from importlib import metadata
from typing import NoReturn

from nmt.allocator import keep_freed_memory
from nmt.cli.bench import add_bench
from nmt.cli.decoding import add_average, add_decoding, add_export, add_serve
from nmt.cli.options import HelpFormatter, dotted_overrides, named_overrides
from nmt.cli.training import add_compare, add_prepare, add_train
from nmt.errors import NMTError, Stopped, UsageError, interrupt_behind, raise_stopped


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations: ``--max-epoch 3`` is an unknown option, not a silent
    ``--max-epochs 3``; help names the scorers (``HelpFormatter``). Subcommands' parsers are
    of the same class."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, formatter_class=HelpFormatter, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, noting the options of the innermost (the command's) parser, which
        parses first: what a misspelt option is compared with (``dotted_overrides``)."""
        namespace, extra = super().parse_known_args(args, namespace)
        if not hasattr(namespace, "known_options"):
            namespace.known_options = [o for action in self._actions for o in action.option_strings]
        return namespace, extra

    def error(self, message: str) -> NoReturn:
        """One line and exit status 2, as argparse's, without the usage block it prints
        first (12 lines for ``nmt translate``, above the one that says what is wrong)."""
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


LIBRARIES = ("torch", "lightning", "sentencepiece", "sacrebleu", "datasets")  # what results depend on


class VersionAction(argparse.Action):
    """``nmt --version``: nmt's version and commit, the libraries' versions and Python's, in
    one line, as a bug report or a result's reader needs them. The libraries' versions come
    from their installed metadata, torch's from torch itself: its build tag (``+cu130``,
    ``+cpu``) tells a CUDA build from a CPU one, and an image's torch may lack it in its
    metadata (``2.11.0`` for ``2.11.0+cu130`` on the lent H200). Torch is imported only when
    asked: parsing any other command line imports none."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the versions of nmt (and its commit) and its libraries")

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        import torch

        from nmt import __version__
        from nmt.provenance import code_commit

        commit = code_commit()
        versions = {name: metadata.version(name) for name in LIBRARIES} | {"torch": torch.__version__}
        libraries = ", ".join(f"{name} {versions[name]}" for name in LIBRARIES)
        python = ".".join(map(str, sys.version_info[:3]))
        print(f"nmt {__version__}{f' (commit {commit})' if commit else ''}: {libraries}, "
              f"Python {python}")
        parser.exit(0)


def parser() -> argparse.ArgumentParser:
    """The parser tree. Each command's parser names the function that runs it (``run_command``),
    whether it takes config overrides, ``--section.key VALUE`` (``takes_overrides``), and
    whether it handles SIGTERM itself (``own_signals``: Lightning's and LitServe's handlers,
    which ``sigterm_as_interrupt`` would stand in the way of)."""
    top = Parser(prog="nmt", description="Neural machine translation for learning, comparing "
                 "and trusting attention: train, translate, evaluate, serve, study.")
    top.add_argument("--version", action=VersionAction)
    top.set_defaults(takes_overrides=False, own_signals=False)
    sub = top.add_subparsers(dest="command", required=True)
    for add_command in (add_train, add_prepare, add_decoding, add_serve, add_export, add_average,
                        add_compare, add_bench):
        add_command(sub)
    return top


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (its terminal closed) raise ``Stopped``, an interrupt as Ctrl-C's,
    while the block runs: what a command was writing (``atomic_path``: a translation, an
    evaluation, an average, an export, a prepared corpus) is then removed, where these
    signals' default left it for good. A signal the process ignores (``nohup``) stays
    ignored. Off the main thread (``main`` called from another), where Python takes no
    handler, the signals keep theirs: a ValueError stopped every such command."""
    settable = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, raise_stopped) for sig in (signal.SIGTERM, signal.SIGHUP)
                if settable  # Python sets handlers in the main thread alone
                and signal.getsignal(sig) is not signal.SIG_IGN}  # nohup's: outlive the terminal
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def hold_standard_fds() -> None:
    """/dev/null on each of fds 0-2 the command was started without (``<&-``, ``>&-``): a file
    opened later would take its number, and --output /dev/stdout would be that file (the
    input, truncated). Python's ``sys.stdin`` / ``sys.stdout`` stay None, which the commands
    that read or write them check."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one


def utf8_stdout() -> None:
    """stdout in UTF-8 whatever the locale, as inputs are read and files written (sacreBLEU's
    rule too): in another encoding (a latin-1 locale) a translation or a printed path with a
    character it lacks was a UnicodeEncodeError traceback, after the work was done."""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.encoding.lower() != "utf-8":
        sys.stdout.reconfigure(encoding="utf-8", errors=sys.stdout.errors)


def main(argv: list[str] | None = None) -> int:
    hold_standard_fds()
    utf8_stdout()
    args, extra = parser().parse_known_args(argv)
    keep_freed_memory()
    try:
        with nullcontext() if args.own_signals else sigterm_as_interrupt():
            if args.takes_overrides:
                args.run_command(args, named_overrides(args) + dotted_overrides(extra, args.known_options))
            elif extra:
                raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
            else:
                args.run_command(args)
    except BaseException as err:
        # a stop; or an error, or Lightning's sys.exit(1) in trainer.fit, raised as one went by
        if (stop := interrupt_behind(err)) is not None:
            return interrupted(stop)
        if isinstance(err, NMTError):
            print(f"error: {err}", file=sys.stderr)
            return 2 if isinstance(err, UsageError) else 1
        if isinstance(err, OSError):  # a file named on the command line that cannot be read
            where = f"{err.filename}: " if err.filename else ""  # or written
            print(f"error: {where}{err.strerror or err}", file=sys.stderr)
            return 1
        raise
    return 0


def interrupted(stop: KeyboardInterrupt) -> int:
    """The line and exit status of a command stopped by a signal: 128 + its number, as the
    signal's default would, or 130 for Ctrl-C, whose message may say what follows (train:
    how to resume)."""
    if isinstance(stop, Stopped):
        print(f"stopped by {signal.Signals(stop.signum).name}", file=sys.stderr)
        return 128 + stop.signum
    print(f"interrupted: {stop}" if str(stop) else "interrupted", file=sys.stderr)
    return 130
