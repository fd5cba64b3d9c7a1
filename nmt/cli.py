"""Command line: ``nmt train | prepare | translate | evaluate | average | compare | bench | serve | export``.

Thin: parse, call, print. Errors a user can fix (bad input, missing files, unknown names)
end with one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nmt.allocator import keep_freed_memory
from nmt.config import DECODING_PRECISIONS
from nmt.errors import NMTError
from nmt.files import write_atomic

# The scorers' names for --help, spelled out so that parsing needs no torch (nmt.attention.SCORERS;
# a test keeps the two in step).
SCORER_NAMES = ("additive", "additive_deep", "dot", "general", "scaled_dot", "symmetric")
# The training flags that train, prepare, compare and bench train share:
# flag -> (the config key it sets, its type, its --help).
TRAIN_FLAGS = {
    "run_dir": ("run_dir", str, "output folder (default checkpoints/<name>)"),
    "max_epochs": ("trainer.max_epochs", int, None),
    "max_time": ("trainer.max_time", str, "HH:MM:SS wall-clock limit"),
    "train_lines": ("data.train_lines", int, "train on the first N lines"),
    "attention": ("model.attention", str, " | ".join(SCORER_NAMES)),
    "src_lang": ("data.src_lang", str, None),
    "tgt_lang": ("data.tgt_lang", str, None),
    "seed": ("seed", int, None),
}


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


def cmd_compare(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.compare import load_compare_config, run_compare

    cfg = load_compare_config(args.config)
    out = Path(args.out or f"study/{args.preset}")
    runs = Path(args.runs or f"checkpoints/study/{args.preset}")
    if args.cost:
        from nmt.study_cost import measure_cost

        measure_cost(cfg, args.preset, out)
    run_compare(cfg, args.preset, out, runs, overrides, seeds=args.seeds,
                train=not (args.tables_only or args.cost), workers=args.jobs)


def cmd_prepare(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.config import load_config
    from nmt.data.prepare import prepare

    config = load_config(args.config, overrides)
    print(f"prepared corpus: {prepare(config.data)}")


def cmd_train(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.config import load_config
    from nmt.training import train

    config = load_config(args.config, overrides)
    run_dir = train(config)
    print(f"run directory: {run_dir}")


def read_lines(path: str | None) -> list[str]:
    """Input lines as text, from a file, a pipe such as /dev/stdin, or stdin; a line that is
    not UTF-8 is an error naming it."""
    try:
        raw = Path(path).read_bytes() if path else sys.stdin.buffer.read()
    except OSError as err:
        raise NMTError(f"cannot read {path or 'stdin'}: {err.strerror}") from None
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    text = []
    for number, line in enumerate(lines, start=1):
        try:
            text.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as err:
            raise NMTError(f"line {number} is not valid UTF-8 (byte {err.start})") from None
    return text


def open_translator(args: argparse.Namespace):
    """The engine's translator for ``--checkpoint``; ``--prune-margin`` (a number of nats,
    or none for the full beam) replaces the run's decoding.prune_margin."""
    from nmt.engines import load_translator

    translator = load_translator(args.checkpoint, args.engine, args.device, args.weights,
                                 args.precision)
    if args.prune_margin is not None:
        if args.engine != "torch":
            raise NMTError("--prune-margin is for the torch engine")
        translator.config.decoding.prune_margin = parse_margin(args.prune_margin)
    return translator


def parse_margin(text: str) -> float | None:
    """``--prune-margin``: a number of nats >= 0, or none (the full beam)."""
    try:
        margin = None if text == "none" else float(text)
        if margin is not None and not margin >= 0:  # NaN too
            raise ValueError(text)
    except ValueError:
        raise NMTError(f"--prune-margin must be a number >= 0 or none, got '{text}'") from None
    return margin


def cmd_translate(args: argparse.Namespace) -> None:
    from nmt.translator import moses_nbest

    translator = open_translator(args)
    need_attn = args.plot_attention is not None
    if need_attn:
        check_plot_options(translator, args)
    lines = read_lines(args.input)
    results = translator.translate(lines, args.beam, args.nbest, args.alpha, need_attn)
    if need_attn:
        from nmt.plots import plot_attention

        plot_attention(translator, lines, results, args.plot_attention, args.attention_kind,
                       args.attention_layer, args.attention_head)
    if args.nbest > 1:
        rows = moses_nbest(results)
    else:
        rows = [hyps[0].text for hyps in results]
    output = "".join(row + "\n" for row in rows)
    if args.output:
        write_atomic(args.output, output)
    else:
        sys.stdout.write(output)


def check_plot_options(translator, args: argparse.Namespace) -> None:
    """The --plot-attention options, checked against the model before anything is translated
    (a bad one fails at once, not after the whole input); makes the pictures' folder."""
    from nmt.attention_stats import attention_layout
    from nmt.plots import check_attention_choice

    layers, heads = attention_layout(translator, args.attention_kind)
    check_attention_choice(layers, heads, args.attention_layer, args.attention_head)
    try:
        Path(args.plot_attention).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NMTError(f"--plot-attention {args.plot_attention}: cannot make a folder there "
                       f"({err.strerror})") from None


def cmd_evaluate(args: argparse.Namespace) -> None:
    from nmt.evaluate import eval_file_stem, evaluate_split, margin_name, write_evaluation

    translator = open_translator(args)
    run_dir = Path(args.checkpoint)
    hyps, scores = evaluate_split(translator, run_dir, args.split, args.beam, args.alpha)
    margin = margin_name(translator.config.decoding.prune_margin) if args.prune_margin else None
    stem = eval_file_stem(args.split, scores["beam"], args.weights, args.alpha, args.precision, margin)
    write_evaluation(run_dir / "eval", stem, hyps, scores)
    print(f"BLEU = {scores['bleu']:.2f}  {scores['bleu_signature']}")
    print(f"chrF = {scores['chrf']:.2f}  {scores['chrf_signature']}")
    print(f"hypotheses and scores written to {run_dir / 'eval'}/")


def cmd_average(args: argparse.Namespace) -> None:
    from nmt.average import average_run

    out, paths = average_run(args.checkpoint, args.last, args.out)
    count = "1 checkpoint" if len(paths) == 1 else f"{len(paths)} checkpoints"
    short = f" (--last {args.last}: the run kept only {len(paths)})" if (args.last or 0) > len(paths) else ""
    print(f"averaged {count} ({', '.join(p.name for p in paths)}) into {out}{short}")


def cmd_serve(args: argparse.Namespace) -> None:
    try:
        from nmt.serve import serve
    except ImportError:
        raise NMTError('nmt serve needs LitServe: pip install -e ".[serve]"') from None
    serve(args.checkpoint, args.host, args.port, args.engine, args.beam, args.max_batch,
          args.weights, args.precision)


def cmd_export(args: argparse.Namespace) -> None:
    if args.format != "ctranslate2":
        raise NMTError(f"unknown export format '{args.format}'; available: ctranslate2")
    try:
        from nmt.export import export_ctranslate2
    except ImportError:
        raise NMTError('nmt export needs CTranslate2: pip install -e ".[export]"') from None
    out = export_ctranslate2(args.checkpoint, args.out, args.quantization)
    print(f"CTranslate2 model ({args.quantization}) written to {out}/; use it with "
          f"nmt translate --engine ctranslate2 --checkpoint {out}")


def print_table(rows: list[dict]) -> None:
    """A Markdown table of dicts sharing their keys."""
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join("" if row.get(k) is None else str(row[k]) for k in keys) + " |")


def print_summary(summary: dict) -> None:
    """A one-row table of a bench's numbers (less its name)."""
    print_table([{k: v for k, v in summary.items() if k != "bench"}])


def cmd_bench_train(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.bench import bench_train
    from nmt.config import load_config

    summary = bench_train(load_config(args.config, overrides), args.steps, args.warmup)
    print_summary(summary)
    print(json.dumps(summary))


def cmd_bench_data(args: argparse.Namespace, overrides: list[str]) -> None:
    from nmt.bench_data import bench_data

    summary = bench_data(args.pairs, args.config, Path(args.dir), args.steps, args.join, overrides)
    print_summary(summary)
    print(json.dumps(summary))


def cmd_bench_attention(args: argparse.Namespace) -> None:
    # The bench times lengths 16, 32, 64, ... up to --max-len; a growth exponent needs two.
    if args.max_len < 32:
        raise NMTError(f"--max-len must be at least 32 (lengths 16, 32, ...), got {args.max_len}")
    from nmt.bench import bench_attention

    summary = bench_attention(args.max_len, args.batch, args.heads, args.head_dim, plot=args.plot)
    print_table(summary["rows"])
    print_table([{"scorer": k, "time_exponent": v["time"], "memory_exponent": v["memory"]}
                 for k, v in summary["exponents"].items()])
    print(json.dumps(summary))


def cmd_bench_decode(args: argparse.Namespace) -> None:
    from nmt.bench import bench_decode

    precisions = tuple(args.precision.split(","))
    unknown = [p for p in precisions if p not in DECODING_PRECISIONS]
    if unknown:
        raise NMTError(f"unknown precision '{unknown[0]}'; choose from: "
                       f"{', '.join(DECODING_PRECISIONS)}")
    summary = bench_decode(args.checkpoint, args.beam, args.split, args.limit,
                           engines=tuple(args.engine.split(",")), precisions=precisions,
                           repeat=args.repeat)
    print_table(summary["rows"])
    print(json.dumps(summary))


def parser() -> argparse.ArgumentParser:
    """The parser tree. Each command's parser names the function that runs it (``run_command``)
    and whether it takes config overrides, ``--section.key VALUE`` (``takes_overrides``)."""
    top = argparse.ArgumentParser(prog="nmt", description=__doc__.splitlines()[0])
    top.set_defaults(takes_overrides=False)
    sub = top.add_subparsers(dest="command", required=True)
    for add_command in (add_train, add_prepare, add_decoding, add_serve, add_export, add_average,
                        add_compare, add_bench):
        add_command(sub)
    return top


def add_train_flags(command: argparse.ArgumentParser, flags: tuple[str, ...]) -> None:
    """``flags`` from TRAIN_FLAGS, in this order, each with its type and help."""
    for flag in flags:
        _, kind, help_text = TRAIN_FLAGS[flag]
        command.add_argument("--" + flag.replace("_", "-"), type=kind, help=help_text)


def add_train(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model (resumes if the run directory has one)",
                           epilog="Any config key can be set as --section.key VALUE, "
                                  "e.g. --trainer.strategy ddp --trainer.devices 2.")
    train.set_defaults(run_command=cmd_train, takes_overrides=True)
    train.add_argument("--config", help="YAML config, e.g. configs/transformer.yaml")
    add_train_flags(train, tuple(TRAIN_FLAGS))


def add_prepare(sub: argparse._SubParsersAction) -> None:
    prepare = sub.add_parser("prepare", help="check, tokenize and cache a corpus (train does it "
                             "too when needed)", epilog="Any config key: --section.key VALUE.")
    prepare.set_defaults(run_command=cmd_prepare, takes_overrides=True)
    prepare.add_argument("--config", help="YAML config, e.g. configs/transformer.yaml")
    add_train_flags(prepare, ("train_lines", "src_lang", "tgt_lang"))


def add_decoding(sub: argparse._SubParsersAction) -> None:
    """``translate`` and ``evaluate``, which share the decoding options."""
    for name, help_text, command in (
            ("translate", "translate lines from stdin or a file", cmd_translate),
            ("evaluate", "BLEU and chrF of a run on a corpus split", cmd_evaluate)):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(run_command=command)
        p.add_argument("--checkpoint", required=True, help="run directory, e.g. checkpoints/<run>")
        p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
        p.add_argument("--alpha", type=float, default=None, help="GNMT length penalty")
        p.add_argument("--prune-margin", help="drop beams more than this many nats below the "
                                              "best (none: keep all K; default: the run's)")
        p.add_argument("--device", default=None, help="cpu | cuda (default: cuda if available)")
        p.add_argument("--engine", default="torch",
                       help="torch | ctranslate2 (--checkpoint: a folder from nmt export)")
        p.add_argument("--weights", help="checkpoint file in the run directory (or a path), e.g. "
                                         "best.ckpt (default: the one training chose)")
        p.add_argument("--precision", choices=DECODING_PRECISIONS,
                       help="decoding precision (default: the run's decoding.precision, auto)")
    translate = sub.choices["translate"]
    translate.add_argument("--input", help="input file (default stdin)")
    translate.add_argument("--output", help="output file (default stdout)")
    translate.add_argument("--nbest", type=int, default=1)
    translate.add_argument("--plot-attention", metavar="DIR",
                           help="write a heatmap PNG of each sentence's attention to DIR")
    translate.add_argument("--attention-kind", default="cross", choices=("cross", "encoder", "decoder"),
                           help="cross-attention, or the Transformer's encoder or decoder self-attention")
    translate.add_argument("--attention-layer", type=int, default=-1,
                           help="Transformer: which layer (default last)")
    translate.add_argument("--attention-head", default="mean",
                           help="Transformer: mean over heads, a head number, or all (one panel each)")
    sub.choices["evaluate"].add_argument("--split", default="test", help="train | val | test")


def add_serve(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="translate over HTTP, with a web page of the attention")
    serve.set_defaults(run_command=cmd_serve)
    serve.add_argument("--checkpoint", required=True, nargs="+",
                       help="run directories (exported models with --engine ctranslate2)")
    serve.add_argument("--host", default="127.0.0.1", help="127.0.0.1, 0.0.0.0 or ::")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--beam", type=int, default=5, help="beam size when a request names none")
    serve.add_argument("--engine", default="torch", help="torch | ctranslate2")
    serve.add_argument("--max-batch", type=int, default=32, help="requests decoded together")
    serve.add_argument("--weights", help="checkpoint file in each run directory (default: the "
                                         "one training chose)")
    serve.add_argument("--precision", choices=DECODING_PRECISIONS,
                       help="decoding precision (default: each run's decoding.precision, auto)")


def add_export(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="convert a Transformer run for another inference engine")
    export.set_defaults(run_command=cmd_export)
    export.add_argument("--checkpoint", required=True, help="run directory")
    export.add_argument("--format", default="ctranslate2", help="ctranslate2")
    export.add_argument("--quantization", default="float32", help="float32 | int8")
    export.add_argument("--out", required=True, help="new directory (or an earlier export, replaced)")


def add_average(sub: argparse._SubParsersAction) -> None:
    average = sub.add_parser("average", help="average the weights of a run's last checkpoints")
    average.set_defaults(run_command=cmd_average)
    average.add_argument("--checkpoint", required=True, help="run directory, e.g. checkpoints/<run>")
    average.add_argument("--last", type=int, help="the last N kept checkpoints (default all)")
    average.add_argument("--out", help="output file (default RUN/averaged.ckpt)")


def add_compare(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser("compare", help="the attention study: families x scorers x seeds",
                             epilog="Other config keys apply to every cell: --section.key VALUE.")
    compare.set_defaults(run_command=cmd_compare, takes_overrides=True)
    compare.add_argument("--config", default="configs/compare.yaml")
    compare.add_argument("--preset", default="quick", help="quick | full | study (see the config)")
    compare.add_argument("--seeds", type=positive_int,
                         help="seeds per cell in every group (default: the preset's)")
    compare.add_argument("--out", help="records, tables and figures (default study/<preset>)")
    compare.add_argument("--runs", help="the cells' run directories (default checkpoints/study/<preset>)")
    compare.add_argument("--tables-only", action="store_true",
                         help="train nothing: rebuild tables and figures from the records")
    compare.add_argument("--cost", action="store_true",
                         help="train nothing: bench each scorer's training cost (on a quiet "
                              "machine), write <out>/cost.json, rebuild the tables")
    compare.add_argument("--jobs", type=positive_int, default=1,
                         help="cells trained at once, each in its own process with an equal share of "
                              "the CPU threads (for a GPU that one small cell leaves idle; default 1)")
    add_train_flags(compare, ("train_lines", "max_epochs", "src_lang", "tgt_lang"))


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print numbers (and a JSON line)")
    what = bench.add_subparsers(dest="what", required=True)
    for add_bench_command in (add_bench_train, add_bench_decode, add_bench_data, add_bench_attention):
        add_bench_command(what)


def add_bench_train(what: argparse._SubParsersAction) -> None:
    bench_train = what.add_parser("train", help="training tokens/s, FLOPs and utilisation")
    bench_train.set_defaults(run_command=cmd_bench_train, takes_overrides=True)
    bench_train.add_argument("--config", required=True)
    bench_train.add_argument("--steps", type=positive_int, default=30, help="timed optimizer steps")
    bench_train.add_argument("--warmup", type=whole_number, default=5, help="untimed steps first")
    add_train_flags(bench_train, ("train_lines", "src_lang", "tgt_lang", "seed", "attention"))


def add_bench_decode(what: argparse._SubParsersAction) -> None:
    bench_decode = what.add_parser("decode", help="greedy and beam search speed on a split")
    bench_decode.set_defaults(run_command=cmd_bench_decode)
    bench_decode.add_argument("--checkpoint", required=True, help="run directory")
    bench_decode.add_argument("--beam", type=positive_ints, default="1,5",
                              help="comma-separated beam sizes")
    bench_decode.add_argument("--split", default="test")
    bench_decode.add_argument("--limit", type=positive_int, help="first N sentences only")
    bench_decode.add_argument("--repeat", type=positive_int, default=3,
                              help="timed passes per setting, taken in turn; the fastest counts")
    bench_decode.add_argument("--engine", default="torch",
                              help="comma-separated: torch, ctranslate2 (the run exported in float32)")
    bench_decode.add_argument("--precision", default="auto",
                              help="comma-separated torch decoding precisions: "
                              + ", ".join(DECODING_PRECISIONS))


def add_bench_data(what: argparse._SubParsersAction) -> None:
    bench_data = what.add_parser("data", help="prepare and training start-up on a synthetic "
                                 "corpus of N pairs", epilog="Config keys: --section.key VALUE.")
    bench_data.set_defaults(run_command=cmd_bench_data, takes_overrides=True)
    bench_data.add_argument("--pairs", type=positive_int, default=100_000)
    bench_data.add_argument("--config", default="configs/transformer.yaml")
    bench_data.add_argument("--steps", type=positive_int, default=5, help="timed training steps")
    bench_data.add_argument("--join", type=positive_int, default=1,
                            help="Multi30k pairs per line (2: ~25 words a side, like WMT)")
    bench_data.add_argument("--dir", default="results/bench_data",
                            help="where the corpus and its prepared folder go")


def add_bench_attention(what: argparse._SubParsersAction) -> None:
    bench_attention = what.add_parser("attention", help="each scorer's cost as length grows")
    bench_attention.set_defaults(run_command=cmd_bench_attention)
    bench_attention.add_argument("--max-len", type=int, default=1024)
    bench_attention.add_argument("--batch", type=positive_int, default=2)
    bench_attention.add_argument("--heads", type=positive_int, default=4)
    bench_attention.add_argument("--head-dim", type=positive_int, default=32)
    bench_attention.add_argument("--plot", default="results/bench_attention.png",
                                 help="log-log plot of time against length")


def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    keep_freed_memory()
    try:
        if args.takes_overrides:
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


if __name__ == "__main__":
    sys.exit(main())
