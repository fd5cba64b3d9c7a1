"""``nmt train | prepare | compare``: the commands that train (or prepare what training reads)."""

from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.cli.options import (
    TRAIN_FLAGS,
    add_train_flags,
    path_option,
    positive_int,
)
from nmt.errors import NMTError
from nmt.processes import CELL_PARENT, RANK_PARENT, die_with_parent, named_to_children

if TYPE_CHECKING:
    from nmt.config import DataConfig


def add_train(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model (resumes if the run directory has one)",
                           epilog="Any config key can be set as --section.key VALUE, "
                                  "e.g. --trainer.max_steps 300, or --trainer.strategy ddp "
                                  "--trainer.devices 2.")
    train.set_defaults(run_command=cmd_train, takes_overrides=True, own_signals=True)
    train.add_argument("--config", type=path_option, help="YAML config, e.g. configs/transformer.yaml")
    add_train_flags(train, tuple(TRAIN_FLAGS))


def die_with_launcher() -> None:
    """A process a launcher started for one of a run's ranks (it sets LOCAL_RANK: Lightning's
    DDP launcher, torchrun) is killed when the process that started it ends. Lightning's
    launcher watches its workers (it ends the run within 5 s of one's death), but nothing
    watched it: killed while a worker started up (SIGKILL, or SIGTERM before training), it
    left that worker waiting for it in the process group's rendezvous for 30 minutes (its
    timeout), unseen. The command's own process names itself to the ones Lightning's launcher
    starts (RANK_PARENT; torchrun's are named nothing): where it ended before one of them
    armed prctl (a stop in the tenth of a second after the start), that one was left so.
    So is a cell's training that ``nmt compare`` started (it names itself in
    CELL_PARENT): compare stopped by SIGTERM (``kill``, ``timeout``) left it training on alone,
    holding its run's lock. Linux's prctl, called first, before the imports; elsewhere nothing."""
    compare = os.environ.pop(CELL_PARENT, None)  # not for the processes training starts
    if compare is not None:
        die_with_parent(int(compare))
    elif "LOCAL_RANK" in os.environ:
        parent = os.environ.pop(RANK_PARENT, None)
        die_with_parent(int(parent) if parent is not None else None)


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> None:
    die_with_launcher()
    from nmt.cli import sigterm_as_interrupt

    # SIGTERM and SIGHUP stop the command in one line, as Ctrl-C, until training starts
    # (``nmt.training.fit`` hands them to Lightning): they killed it without a word (exit
    # status 143), and a corpus half prepared was left behind; so did they while torch and
    # Lightning were imported (seconds). Not in a process a launcher started, which ends
    # with it: the first process says it, once.
    own = "LOCAL_RANK" not in os.environ  # the command's own process, not one a launcher started
    with sigterm_as_interrupt() if own else nullcontext():
        from lightning.pytorch.utilities import rank_zero_only

        from nmt.config import load_config
        from nmt.training import train

        config = load_config(args.config, overrides)
        with named_to_children(RANK_PARENT) if own else nullcontext():
            run_dir = train(config)
    if rank_zero_only.rank == 0:  # once, not by every DDP process
        print(f"run directory: {run_dir}")


def add_prepare(sub: argparse._SubParsersAction) -> None:
    prepare = sub.add_parser("prepare", help="check, tokenize and cache a corpus (train does it "
                             "too when needed)", epilog="Any config key: --section.key VALUE.")
    prepare.set_defaults(run_command=cmd_prepare, takes_overrides=True)
    prepare.add_argument("--config", type=path_option, help="YAML config, e.g. configs/transformer.yaml")
    prepare.add_argument("--list", action="store_true",
                         help="prepare nothing: list the prepared folders of the config's "
                              "data_dir (pairs, vocabulary, size, date), the config's marked")
    add_train_flags(prepare, ("train_lines", "src_lang", "tgt_lang"))


def cmd_prepare(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.config import absolute_file_paths, load_config
    from nmt.config_checks import check_data_config
    from nmt.data.prepare import prepare

    config = load_config(args.config, overrides)
    check_data_config(config)  # as train does: --train-lines -5 would cut lines off the end
    absolute_file_paths(config)  # the folder named as train names it
    if args.list:
        list_prepared(config.data)
        return
    print(f"prepared corpus: {prepare(config.data)}")


def list_prepared(data: DataConfig) -> None:
    """``nmt prepare --list``: one row per prepared folder, the one ``data`` uses marked "*";
    its folder is found as prepare finds it, without preparing (a Hub corpus' is found where
    its files are cached or reachable; else the list comes without the mark)."""
    from nmt.data.corpus import split_sources
    from nmt.data.prepare import prepared_dir, prepared_folders

    try:
        mine = prepared_dir(data, split_sources(data)).name
    except NMTError as err:
        mine, why = None, f"this config's folder is unknown: {err}"
    rows = prepared_folders(data.data_dir)
    if rows:
        print("| | folder | train / val / test pairs | vocab | size | prepared | state |")
        print("|---|---|---|---|---|---|---|")
    for row in rows:
        pairs = " / ".join(f"{row['pairs'].get(split, 0):,}" for split in ("train", "val", "test")) \
            if row["pairs"] else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["when"]))
        print(f"| {'*' if row['name'] == mine else ''} | {row['name']} | {pairs} | "
              f"{row['vocab'] or ''} | {row['bytes'] / 2**20:,.1f} MB | {when} | {row['state']} |")
    if mine is None:
        print(why)
    elif mine not in {row["name"] for row in rows}:
        print(f"this config's folder, {mine}, is not prepared yet: nmt prepare or nmt train makes it")
    else:
        print(f"* the folder this config uses; {len(rows)} in {Path(data.data_dir) / 'prepared'}")


def add_compare(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser("compare", help="the attention study: families x scorers x seeds",
                             epilog="Other config keys apply to every cell: --section.key VALUE.")
    compare.set_defaults(run_command=cmd_compare, takes_overrides=True, own_signals=True)
    compare.add_argument("--config", type=path_option, default="configs/compare.yaml",
                         help="the study's config (default configs/compare.yaml)")
    compare.add_argument("--preset", default="quick",
                         help="a preset of the config: quick (default) | full | study")
    compare.add_argument("--seeds", type=positive_int,
                         help="seeds per cell in every group (default: the preset's)")
    compare.add_argument("--out", type=path_option,
                         help="records, tables and figures (default study/<preset>)")
    compare.add_argument("--runs", type=path_option,
                         help="the cells' run directories (default checkpoints/study/<preset>)")
    what = compare.add_mutually_exclusive_group()  # each trains nothing; --cost benches
    what.add_argument("--tables-only", action="store_true",
                      help="train nothing: rebuild tables and figures from the records (a "
                           "record of another beam or other pictures is decoded again where "
                           "its run directory is here)")
    what.add_argument("--cost", action="store_true",
                      help="train nothing: bench each scorer's training cost (on a quiet "
                           "machine), write <out>/cost.json, rebuild the tables")
    compare.add_argument("--jobs", type=positive_int, default=1,
                         help="cells trained at once, each in its own process with an equal share of "
                              "the CPU threads (for a GPU that one small cell leaves idle; default 1)")
    add_train_flags(compare, ("train_lines", "max_epochs", "src_lang", "tgt_lang"))


def cmd_compare(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.compare import load_compare_config, run_compare

    cfg = load_compare_config(args.config)
    out = Path(args.out or f"study/{args.preset}")
    runs = Path(args.runs or f"checkpoints/study/{args.preset}")
    run_compare(cfg, args.preset, out, runs, overrides, seeds=args.seeds,
                train=not (args.tables_only or args.cost), workers=args.jobs, cost=args.cost)
