"""``nmt bench train | decode | data | attention``: benchmarks that print a table and, last,
a one-line JSON summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nmt.cli.options import (
    add_train_flags,
    path_option,
    positive_int,
    positive_ints,
    print_table,
    whole_number,
)
from nmt.config import DECODING_PRECISIONS
from nmt.errors import NMTError


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print numbers (and a JSON line)")
    what = bench.add_subparsers(dest="what", required=True)
    for add_bench_command in (add_bench_train, add_bench_decode, add_bench_data, add_bench_attention):
        add_bench_command(what)


def add_bench_train(what: argparse._SubParsersAction) -> None:
    bench_train = what.add_parser("train", help="training tokens/s, FLOPs and utilisation",
                                  epilog="Any config key: --section.key VALUE.")
    bench_train.set_defaults(run_command=cmd_bench_train, takes_overrides=True, own_signals=True)
    bench_train.add_argument("--config", required=True, type=path_option,
                             help="YAML config, e.g. configs/transformer.yaml")
    bench_train.add_argument("--steps", type=positive_int, default=30, help="timed optimizer steps")
    bench_train.add_argument("--warmup", type=whole_number, default=5, help="untimed steps first")
    add_train_flags(bench_train, ("train_lines", "src_lang", "tgt_lang", "seed", "attention"))


def cmd_bench_train(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.bench import bench_train
    from nmt.config import load_config

    summary = bench_train(load_config(args.config, overrides), args.steps, args.warmup)
    print_summary(summary)
    print(json.dumps(summary))


def add_bench_decode(what: argparse._SubParsersAction) -> None:
    bench_decode = what.add_parser("decode", help="greedy and beam search speed on a split")
    bench_decode.set_defaults(run_command=cmd_bench_decode)
    bench_decode.add_argument("--checkpoint", required=True, type=path_option, help="run directory")
    bench_decode.add_argument("--beam", type=positive_ints, default="1,5",
                              help="comma-separated beam sizes (default 1,5)")
    bench_decode.add_argument("--split", default="test", help="train | val | test (default test)")
    bench_decode.add_argument("--limit", type=positive_int, help="first N sentences only")
    bench_decode.add_argument("--repeat", type=positive_int, default=3,
                              help="timed passes per setting, taken in turn; the fastest counts")
    bench_decode.add_argument("--engine", default="torch",
                              help="comma-separated: torch, ctranslate2 (the run exported in float32)")
    bench_decode.add_argument("--precision", default="auto",
                              help="comma-separated torch decoding precisions: "
                              + ", ".join(DECODING_PRECISIONS))
    bench_decode.add_argument("--ensemble", nargs="+", type=path_option, default=[], metavar="RUN",
                              help="more run directories to decode with, as translate's --ensemble")
    bench_decode.add_argument("--no-recompute", action="store_true",
                              help="leave out the greedy_recompute row (the whole decoder over the "
                              "prefix at every step: the slowest row, and most of the memory)")


def cmd_bench_decode(args: argparse.Namespace) -> None:
    from nmt.bench import bench_decode

    precisions = tuple(args.precision.split(","))
    unknown = [p for p in precisions if p not in DECODING_PRECISIONS]
    if unknown:
        raise NMTError(f"unknown precision '{unknown[0]}'; choose from: "
                       f"{', '.join(DECODING_PRECISIONS)}")
    summary = bench_decode(args.checkpoint, args.beam, args.split, args.limit,
                           engines=tuple(args.engine.split(",")), precisions=precisions,
                           repeat=args.repeat, ensemble=args.ensemble,
                           recompute=not args.no_recompute)
    print_table(summary["rows"])
    print(json.dumps(summary))


def add_bench_data(what: argparse._SubParsersAction) -> None:
    bench_data = what.add_parser("data", help="prepare and training start-up on a synthetic "
                                 "corpus of N pairs", epilog="Config keys: --section.key VALUE.")
    bench_data.set_defaults(run_command=cmd_bench_data, takes_overrides=True)
    bench_data.add_argument("--pairs", type=positive_int, default=100_000)
    bench_data.add_argument("--config", type=path_option, default="configs/transformer.yaml")
    bench_data.add_argument("--steps", type=positive_int, default=5, help="timed training steps")
    bench_data.add_argument("--join", type=positive_int, default=1,
                            help="Multi30k pairs per line (2: ~25 words a side, like WMT)")
    bench_data.add_argument("--dir", type=path_option, default="results/bench_data",
                            help="where the corpus and its prepared folder go")


def cmd_bench_data(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.bench_data import bench_data

    summary = bench_data(args.pairs, args.config, Path(args.dir), args.steps, args.join, overrides)
    print_summary(summary)
    print(json.dumps(summary))


def add_bench_attention(what: argparse._SubParsersAction) -> None:
    bench_attention = what.add_parser("attention", help="each scorer's cost as length grows")
    bench_attention.set_defaults(run_command=cmd_bench_attention)
    bench_attention.add_argument("--max-len", type=int, default=1024,
                                 help="lengths timed: 16, 32, 64, ..., doubling up to this "
                                 "(1000 stops at 512; default 1024)")
    bench_attention.add_argument("--batch", type=positive_int, default=2,
                                 help="sentences attended at once (default 2)")
    bench_attention.add_argument("--heads", type=positive_int, default=4,
                                 help="attention heads (default 4)")
    bench_attention.add_argument("--head-dim", type=positive_int, default=32,
                                 help="each head's query, key and value size, and the additive "
                                 "scorers' hidden size (default 32)")
    bench_attention.add_argument("--plot", default="results/bench_attention.png",
                                 help="log-log plot of time against length (default "
                                 "results/bench_attention.png; '' draws none)")
    bench_attention.add_argument("--memory-limit-mb", type=positive_int, default=None,
                                 help="the most memory each point may allocate beyond what its "
                                 "process holds at its start (its data segment, Linux; not the "
                                 "peak RSS of peak_mb); a point that needs more ends its "
                                 "scorer's rows, not the machine's memory")


def cmd_bench_attention(args: argparse.Namespace) -> None:
    # The bench times lengths 16, 32, 64, ... up to --max-len; a growth exponent needs two.
    if args.max_len < 32:
        raise NMTError(f"--max-len must be at least 32 (lengths 16, 32, ...), got {args.max_len}")
    from nmt.bench_attention import RSS_RESOLUTION_MB, bench_attention
    from nmt.plots import check_picture_path

    if args.plot:  # "" draws none
        check_picture_path(args.plot)
    summary = bench_attention(args.max_len, args.batch, args.heads, args.head_dim, plot=args.plot,
                              memory_limit_mb=args.memory_limit_mb)
    print_table(summary["rows"])
    for row in summary["rows"]:
        if "error" in row:
            print(f"{row['scorer']}: {row['error']} at length {row['length']}; longer lengths "
                  "not tried")
    if summary["exponents"]:
        print_table([{"scorer": k, "time_exponent": v["time"], "memory_exponent": v["memory"]}
                     for k, v in summary["exponents"].items()])
    else:
        print("no scorer has two lengths measured: no growth exponents")
    if any(v["memory"] is None for v in summary["exponents"].values()):
        print(f"peak_mb is the rise of the process's peak RSS, which the allocator's reuse keeps at "
              f"or near 0 for small tensors; a memory exponent needs peaks of "
              f"{RSS_RESOLUTION_MB:.0f} MB or more over the longer half of the lengths (a longer "
              "--max-len), else it is empty")
    print(f"measured on {summary['device']}, {summary['precision']}, {summary['threads']} threads")
    if args.plot:  # the default's folder is no command's output: said, or it went unseen
        print(f"plot of time against length: {args.plot}")
    print(json.dumps(summary))


def print_summary(summary: dict) -> None:
    """A one-row table of a bench's numbers (less its name)."""
    print_table([{k: v for k, v in summary.items() if k != "bench"}])
