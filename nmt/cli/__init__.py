"""Command line: ``nmt train | prepare | translate | evaluate | average | compare | bench | serve | export``.

Thin: parse, call, print. Errors a user can fix (bad input, missing files, unknown names)
end with one line on stderr and exit status 1, never a traceback. Each command is two
functions in one of the modules here: ``add_<command>`` builds its parser, naming
``cmd_<command>``, which runs it. Parsing imports no torch: the commands import what they
need when they run.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from nmt.allocator import keep_freed_memory
from nmt.cli.bench import add_bench
from nmt.cli.decoding import add_average, add_decoding, add_export, add_serve
from nmt.cli.options import HelpFormatter, dotted_overrides, named_overrides
from nmt.cli.training import add_compare, add_prepare, add_train
from nmt.errors import NMTError


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations: ``--max-epoch 3`` is an unknown option, not a silent
    ``--max-epochs 3``; help names the scorers (``HelpFormatter``). Subcommands' parsers are
    of the same class."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, formatter_class=HelpFormatter, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, noting the options of the innermost (the command's) parser, which
        parses first: what a misspelt option is compared with (``check_undotted``)."""
        namespace, extra = super().parse_known_args(args, namespace)
        if not hasattr(namespace, "known_options"):
            namespace.known_options = [o for action in self._actions for o in action.option_strings]
        return namespace, extra


TOP_LEVEL_KEYS = ("name", "seed", "run_dir")  # config keys outside a section: --name X is one


def check_undotted(extra: list[str], known_options: list[str]) -> None:
    """An option left over by the parser that has no dot is no --section.key override: a
    one-line error with the nearest option the command has (it read as a config key)."""
    for arg in extra:
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or "." in name or name[2:].replace("-", "_") in TOP_LEVEL_KEYS:
            continue
        near = difflib.get_close_matches(name, known_options, n=1, cutoff=0.6)
        hint = (f"did you mean {near[0]}?" if near else
                "config keys are set as --section.key VALUE, e.g. --trainer.max_epochs 3")
        raise NMTError(f"unknown option {name}: {hint}")


def parser() -> argparse.ArgumentParser:
    """The parser tree. Each command's parser names the function that runs it (``run_command``)
    and whether it takes config overrides, ``--section.key VALUE`` (``takes_overrides``)."""
    top = Parser(prog="nmt", description=__doc__.splitlines()[0])
    top.set_defaults(takes_overrides=False)
    sub = top.add_subparsers(dest="command", required=True)
    for add_command in (add_train, add_prepare, add_decoding, add_serve, add_export, add_average,
                        add_compare, add_bench):
        add_command(sub)
    return top

def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    keep_freed_memory()
    try:
        if args.takes_overrides:
            check_undotted(extra, args.known_options)
            args.run_command(args, named_overrides(args) + dotted_overrides(extra))
        elif extra:
            raise NMTError(f"unrecognized arguments: {' '.join(extra)}")
        else:
            args.run_command(args)
    except NMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a file named on the command line that cannot be read or written
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
