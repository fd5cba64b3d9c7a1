"""What several commands share: the training flags, argparse types for counts, config
overrides from the command line, and Markdown tables."""

from __future__ import annotations

import argparse
import difflib
import json
from dataclasses import fields, is_dataclass

from nmt.config import Config
from nmt.errors import UsageError


def path_option(text: str) -> str:
    """An argparse type for a file or folder option: an empty one (an unset shell variable) is
    refused, where it read as the current folder ("." exists and is not an export), stdin or
    stdout, or the option's default (an average, a study's records, a run written there)."""
    if not text:
        raise argparse.ArgumentTypeError("is empty (an unset variable?): name a file or folder")
    return text


# Config's top-level keys -> the keys of the section each names (none for a single value or
# the model's free-form dict): what an undotted override may set (``dotted_overrides``).
CONFIG_SECTIONS = {f.name: [k.name for k in fields(f.default_factory)]
                   if is_dataclass(f.default_factory) else [] for f in fields(Config)}
# The config keys that take a list ("[a,b]"), where one more value on the command line was meant.
LIST_KEYS = {f"{f.name}.{k.name}" for f in fields(Config) if is_dataclass(f.default_factory)
             for k in fields(f.default_factory) if str(k.type).startswith(("list", "tuple"))}
# Where a help text says this, --help prints the scorers' names from nmt.attention.SCORERS
# (``HelpFormatter``): they have one home, and parsing itself needs no torch.
SCORER_NAMES_PLACEHOLDER = "{scorer names}"
# The training flags that train, prepare, compare and bench train share:
# flag -> (the config key it sets, its type, its --help).
TRAIN_FLAGS = {
    "run_dir": ("run_dir", path_option, "output folder (default checkpoints/<name>)"),
    "max_epochs": ("trainer.max_epochs", int, "train at most N epochs (trainer.max_epochs)"),
    "max_time": ("trainer.max_time", str, "HH:MM:SS of training, all the run's segments "
                 "counted (start-up not)"),
    "train_lines": ("data.train_lines", int, "train on the first N lines"),
    "attention": ("model.attention", str, SCORER_NAMES_PLACEHOLDER),
    "src_lang": ("data.src_lang", str, "source language code, e.g. de (data.src_lang)"),
    "tgt_lang": ("data.tgt_lang", str, "target language code, e.g. en (data.tgt_lang)"),
    "seed": ("seed", int, "random seed (batches, dropout, initialisation)"),
}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, with SCORER_NAMES_PLACEHOLDER replaced by the registry's names,
    ``a | b | ...`` (torch is imported then: only to print help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and SCORER_NAMES_PLACEHOLDER in text:
            from nmt.attention import SCORERS

            text = text.replace(SCORER_NAMES_PLACEHOLDER, " | ".join(SCORERS))
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


def dotted_overrides(extra: list[str], known_options: list[str] = ()) -> list[str]:
    """``--a.b v``, ``--a.b=v`` and ``a.b=v`` -> ["a.b=v", ...]; an undotted ``--key`` that is
    no config field is a misspelt option (``unknown_option``), the nearest of
    ``known_options`` named."""
    out, i = [], 0  # (the option as named, "key=value")
    while i < len(extra):
        arg = extra[i]
        if arg.startswith("--") and "=" in arg:
            out.append((arg.split("=", 1)[0], arg[2:]))
        elif arg.startswith("--") and i + 1 < len(extra):
            out.append((arg, f"{arg[2:]}={extra[i + 1]}"))
            i += 1
        elif "=" in arg and not arg.startswith("-"):
            out.append((arg.split("=", 1)[0], arg))
        else:
            raise _unreadable(arg, out[-1] if out else None)
        i += 1
    pairs = [(name, *override.split("=", 1)) for name, override in out]  # name, key, value
    for name, given, _ in pairs:
        key = given.replace("-", "_")
        if "." not in key and key not in CONFIG_SECTIONS:
            raise unknown_option(name, key, known_options)
    return [key.replace("-", "_") + "=" + value for _, key, value in pairs]


def _unreadable(arg: str, last: tuple[str, str] | None) -> UsageError:
    """A one-line error for ``arg``, which is no option nor the value of one. Right after an
    option and its value (``last``: the option as named, "key=value") it is most likely a second
    value for a list key (``--data.train_files x.de x.en``): the message writes the list."""
    key, value = last[1].split("=", 1) if last else ("", "")
    if key.replace("-", "_") in LIST_KEYS and not arg.startswith("-"):
        name = last[0]
        return UsageError(f"cannot read option '{arg}': {name} takes one value; "
                          f"write a list as one, {name}='[{value},{arg}]'")
    return UsageError(f"cannot read option '{arg}'; use --section.key VALUE or section.key=VALUE")


def unknown_option(name: str, key: str, known_options: list[str]) -> UsageError:
    """A one-line error for option ``name`` (config key ``key``) that no parser took: the
    command's option of that name (--src_lang: --src-lang), else the config key of that name
    in its section (--lr: --optim.lr; lr=0.1: optim.lr), else the command's nearest option
    (--max-tim: --max-time)."""
    options = [o for o in known_options if o not in ("-h", "--help")]
    same = [o for o in options if o == "--" + key.replace("_", "-")]
    dashes = "--" if name.startswith("--") else ""  # a config key as the user wrote theirs
    sections = [f"{dashes}{section}.{key}" for section, fields in CONFIG_SECTIONS.items() if key in fields]
    near = same or sections or difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    hint = (f"did you mean {near[0]}?" if near else
            "config keys are set as --section.key VALUE, e.g. --trainer.max_epochs 3")
    return UsageError(f"unknown option {name}: {hint}")


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
    """A Markdown table of dicts: a column for each key any row has, empty where a row has none."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join("" if row.get(k) is None else str(row[k]) for k in keys) + " |")
