"""What several commands share: the training flags, argparse types for counts, config
overrides from the command line, and Markdown tables."""

from __future__ import annotations

import argparse
import json

from nmt.errors import NMTError

# Where a help text says this, --help prints the scorers' names from nmt.attention.SCORERS
# (``HelpFormatter``): they have one home, and parsing itself needs no torch.
SCORER_NAMES = "{scorer names}"
# The training flags that train, prepare, compare and bench train share:
# flag -> (the config key it sets, its type, its --help).
TRAIN_FLAGS = {
    "run_dir": ("run_dir", str, "output folder (default checkpoints/<name>)"),
    "max_epochs": ("trainer.max_epochs", int, None),
    "max_time": ("trainer.max_time", str, "HH:MM:SS wall-clock limit"),
    "train_lines": ("data.train_lines", int, "train on the first N lines"),
    "attention": ("model.attention", str, SCORER_NAMES),
    "src_lang": ("data.src_lang", str, None),
    "tgt_lang": ("data.tgt_lang", str, None),
    "seed": ("seed", int, None),
}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with SCORER_NAMES replaced by the registry's names, ``a | b | ...``
    (torch is imported then: only to print help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and SCORER_NAMES in text:
            from nmt.attention import SCORERS

            text = text.replace(SCORER_NAMES, " | ".join(SCORERS))
        return text


def whole_number(text: str, least: int = 0) -> int:
    """An argparse type for a count of at least ``least`` (warm-up steps: 0 or more)."""
    if not (text.isdecimal() and int(text) >= least):
        raise argparse.ArgumentTypeError(f"must be a whole number >= {least}, got '{text}'")
    return int(text)

def positive_int(text: str) -> int:
    """An argparse type for a count that must be at least 1 (steps, seeds, sentences)."""
    return whole_number(text, least=1)

def positive_ints(text: str) -> list[int]:
    """An argparse type for comma-separated counts, e.g. beam sizes 1,5."""
    return [positive_int(part) for part in text.split(",")]

def dotted_overrides(extra: list[str]) -> list[str]:
    """``--a.b v``, ``--a.b=v`` and ``a.b=v`` -> ["a.b=v", ...]."""
    out, i = [], 0
    while i < len(extra):
        arg = extra[i]
        if arg.startswith("--") and "=" in arg:
            out.append(arg[2:])
        elif arg.startswith("--") and i + 1 < len(extra):
            out.append(f"{arg[2:]}={extra[i + 1]}")
            i += 1
        elif "=" in arg and not arg.startswith("-"):
            out.append(arg)
        else:
            raise NMTError(f"cannot read option '{arg}'; use --section.key VALUE or section.key=VALUE")
        i += 1
    return [key.replace("-", "_") + "=" + value for key, value in (o.split("=", 1) for o in out)]

def named_overrides(args: argparse.Namespace) -> list[str]:
    """The named training flags given, as config overrides (quoted: "no" stays a string)."""
    return [f"{key}={json.dumps(str(value))}" for flag, (key, _, _) in TRAIN_FLAGS.items()
            if (value := getattr(args, flag, None)) is not None]

def add_train_flags(command: argparse.ArgumentParser, flags: tuple[str, ...]) -> None:
    """``flags`` from TRAIN_FLAGS, in this order, each with its type and help."""
    for flag in flags:
        _, kind, help_text = TRAIN_FLAGS[flag]
        command.add_argument("--" + flag.replace("_", "-"), type=kind, help=help_text)

def print_table(rows: list[dict]) -> None:
    """A Markdown table of dicts sharing their keys."""
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join("" if row.get(k) is None else str(row[k]) for k in keys) + " |")
