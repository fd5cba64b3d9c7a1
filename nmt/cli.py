"""Command line: ``nmt train | translate | evaluate | average | compare | bench | serve | export``.

Thin: parse, call, print. Errors a user can fix (bad input, missing files, unknown names)
end with one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.allocator import keep_freed_memory
from nmt.config import DECODING_PRECISIONS
from nmt.errors import NMTError
from nmt.files import write_atomic

if TYPE_CHECKING:  # parsing needs no torch
    from torch import Tensor

# Named training flags -> the config key they set.
TRAIN_FLAGS = {
    "run_dir": "run_dir",
    "max_epochs": "trainer.max_epochs",
    "max_time": "trainer.max_time",
    "train_lines": "data.train_lines",
    "attention": "model.attention",
    "src_lang": "data.src_lang",
    "tgt_lang": "data.tgt_lang",
    "seed": "seed",
}
# The scorers' names for --help, spelled out so that parsing needs no torch (nmt.attention.SCORERS;
# a test keeps the two in step).
SCORER_NAMES = ("additive", "additive_deep", "dot", "general", "scaled_dot", "symmetric")


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
    return [f"{key}={json.dumps(str(value))}" for flag, key in TRAIN_FLAGS.items()
            if (value := getattr(args, flag, None)) is not None]


def cmd_compare(args: argparse.Namespace, extra: list[str]) -> None:
    from nmt.compare import load_compare_config, run_compare

    if args.jobs < 1:
        raise NMTError(f"--jobs must be at least 1, got {args.jobs}")
    cfg = load_compare_config(args.config)
    out = Path(args.out or f"study/{args.preset}")
    runs = Path(args.runs or f"checkpoints/study/{args.preset}")
    if args.cost:
        from nmt.study_cost import measure_cost

        measure_cost(cfg, args.preset, out)
    run_compare(cfg, args.preset, out, runs, named_overrides(args) + dotted_overrides(extra),
                seeds=args.seeds, train=not (args.tables_only or args.cost), workers=args.jobs)


def cmd_prepare(args: argparse.Namespace, extra: list[str]) -> None:
    from nmt.config import load_config
    from nmt.data.prepare import prepare

    config = load_config(args.config, named_overrides(args) + dotted_overrides(extra))
    print(f"prepared corpus: {prepare(config.data)}")


def cmd_train(args: argparse.Namespace, extra: list[str]) -> None:
    from nmt.config import load_config
    from nmt.training import train

    config = load_config(args.config, named_overrides(args) + dotted_overrides(extra))
    run_dir = train(config)
    print(f"run directory: {run_dir}")


def read_lines(path: str | None) -> list[str]:
    """Input lines as text; a line that is not UTF-8 is an error naming it."""
    if path is not None and not Path(path).is_file():
        raise NMTError(f"input file not found: {path}")
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


def margin_name(margin: float | None) -> str:
    """A prune margin in a file name: none, 3, 2.5."""
    return "none" if margin is None else f"{margin:g}"


def cmd_translate(args: argparse.Namespace) -> None:
    from nmt.translator import moses_nbest

    translator = open_translator(args)
    lines = read_lines(args.input)
    need_attn = args.plot_attention is not None
    results = translator.translate(lines, args.beam, args.nbest, args.alpha, need_attn)
    if need_attn:
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


def plot_attention(translator, lines: list[str], results, folder: str, kind: str, layer: int,
                   head: str) -> None:
    """One heatmap PNG per input line (its best translation): <folder>/<line number>.png,
    of the cross-attention or (Transformer) the encoder or decoder self-attention."""
    from nmt.attention_stats import translation_attention
    from nmt.plots import save_attention_grid

    if head not in ("mean", "all") and not head.isdigit():
        raise NMTError(f"--attention-head must be mean, all or a head number, got '{head}'")
    if kind != "cross" and not hasattr(translator, "model"):
        raise NMTError(f"--attention-kind {kind} needs the torch engine")
    for number, (line, hyps) in enumerate(zip(lines, results), start=1):
        best = hyps[0]
        if best.attention is None:  # empty input line: nothing to draw
            continue
        weights, rows, columns = translation_attention(translator, line, best, kind)  # (L, H, T, S)
        panels = attention_panels(weights, f"line {number}, {kind}", layer, head)
        save_attention_grid(Path(folder) / f"{number:04d}.png",
                            [(title, w, columns, rows) for title, w in panels])


def attention_panels(weights: Tensor, title: str, layer: int, head: str) -> list[tuple[str, Tensor]]:
    """(title, (T, S) weights) per panel: ``layer``'s mean over heads, one head, or each head.
    An RNN, and CTranslate2 (the last layer's mean over heads), give one map: (1, 1, T, S)."""
    layers, heads = weights.shape[:2]
    if (layers, heads) == (1, 1):
        if layer not in (0, -1) or head not in ("mean", "all", "0"):
            raise NMTError("this model gives one attention map (an RNN's, or CTranslate2's mean of "
                           "the last layer's heads): no --attention-layer or --attention-head to pick")
        return [(title, weights[0, 0])]
    if not -layers <= layer < layers or (head.isdigit() and int(head) >= heads):
        raise NMTError(f"no attention layer {layer} / head {head} in this model: it has {layers} "
                       f"layer{'s' * (layers != 1)} and {heads} head{'s' * (heads != 1)}, counted "
                       "from 0 (layer -1 is the last)")
    per_head = weights[layer]  # (H, T, S)
    where = f"{title}, layer {layer % layers}, " if layers > 1 else f"{title}, "
    if head == "mean":
        return [(where + "mean of heads", per_head.mean(0))]
    chosen = range(heads) if head == "all" else [int(head)]
    return [(where + f"head {h}", per_head[h]) for h in chosen]


def eval_file_stem(args: argparse.Namespace, beam: int, prune_margin: float | None) -> str:
    """RUN/eval/<stem>.{hyp,json}: the split and beam, then each decoding option given on the
    command line, so a non-default decoding never overwrites the default one's files."""
    parts = [f"{args.split}.beam{beam}"]
    if args.weights:
        parts.append(Path(args.weights).stem)
    if args.alpha is not None:
        parts.append(f"alpha{args.alpha:g}")
    if args.precision:
        parts.append(args.precision)
    if args.prune_margin:
        parts.append(f"prune-{margin_name(prune_margin)}")
    return ".".join(parts)


def weights_name(run_dir: Path, checkpoint: Path) -> str:
    """The weights file evaluate decoded with: relative to the run directory where inside it."""
    path, run_dir = checkpoint.resolve(), run_dir.resolve()
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)


def cmd_evaluate(args: argparse.Namespace) -> None:
    from nmt.data.corpus import load_corpus
    from nmt.metrics import score_corpus
    from nmt.translator import decoding_options

    translator = open_translator(args)
    corpus = load_corpus(translator.config.data)
    if args.split not in corpus:
        raise NMTError(f"split '{args.split}' not in the corpus; available: {', '.join(corpus)}")
    sources, references = corpus[args.split]["src"], corpus[args.split]["tgt"]
    beam, alpha = decoding_options(translator.config.decoding, args.beam, 1, args.alpha)
    hyps = [h[0].text for h in translator.translate(list(sources), beam, 1, alpha)]
    scores = score_corpus(hyps, list(references))
    scores.update(split=args.split, beam=beam, alpha=alpha)
    if args.engine == "torch":
        scores.update(precision=translator.precision.precision,
                      prune_margin=translator.config.decoding.prune_margin,
                      weights=weights_name(Path(args.checkpoint), translator.checkpoint))
    out = Path(args.checkpoint) / "eval"
    name = eval_file_stem(args, beam, translator.config.decoding.prune_margin)
    write_atomic(out / f"{name}.hyp", "".join(h + "\n" for h in hyps))
    write_atomic(out / f"{name}.json", json.dumps(scores, indent=2) + "\n")
    print(f"BLEU = {scores['bleu']:.2f}  {scores['bleu_signature']}")
    print(f"chrF = {scores['chrf']:.2f}  {scores['chrf_signature']}")
    print(f"hypotheses and scores written to {out}/")


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


def cmd_bench(args: argparse.Namespace, extra: list[str]) -> None:
    from nmt import bench

    if args.what == "train":
        from nmt.config import load_config

        config = load_config(args.config, named_overrides(args) + dotted_overrides(extra))
        summary = bench.bench_train(config, args.steps, args.warmup)
        print_table([{k: v for k, v in summary.items() if k != "bench"}])
    elif args.what == "data":
        from nmt.data.benchmark import bench_data

        summary = bench_data(args.pairs, args.config, Path(args.dir), args.steps, args.join,
                             dotted_overrides(extra))
        print_table([{k: v for k, v in summary.items() if k != "bench"}])
    elif extra:
        raise NMTError(f"unrecognized arguments: {' '.join(extra)}")
    elif args.what == "attention":
        summary = bench.bench_attention(args.max_len, args.batch, args.heads, args.head_dim,
                                        plot=args.plot)
        print_table(summary["rows"])
        print_table([{"scorer": k, "time_exponent": v["time"], "memory_exponent": v["memory"]}
                     for k, v in summary["exponents"].items()])
    else:
        beams = [int(b) for b in args.beam.split(",")]
        precisions = tuple(args.precision.split(","))
        unknown = [p for p in precisions if p not in DECODING_PRECISIONS]
        if unknown:
            raise NMTError(f"unknown precision '{unknown[0]}'; choose from: "
                           f"{', '.join(DECODING_PRECISIONS)}")
        if args.repeat < 1:
            raise NMTError(f"--repeat must be at least 1, got {args.repeat}")
        summary = bench.bench_decode(args.checkpoint, beams, args.split, args.limit,
                                     engines=tuple(args.engine.split(",")), precisions=precisions,
                                     repeat=args.repeat)
        print_table(summary["rows"])
    print(json.dumps(summary))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="nmt", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    for add_command in (add_train, add_prepare, add_decoding, add_serve, add_export, add_average,
                        add_compare, add_bench):
        add_command(sub)
    return top


def add_train(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a model (resumes if the run directory has one)",
                           epilog="Any config key can be set as --section.key VALUE, "
                                  "e.g. --trainer.strategy ddp --trainer.devices 2.")
    train.add_argument("--config", help="YAML config, e.g. configs/transformer.yaml")
    train.add_argument("--run-dir", help="output folder (default checkpoints/<name>)")
    train.add_argument("--max-epochs", type=int)
    train.add_argument("--max-time", help="HH:MM:SS wall-clock limit")
    train.add_argument("--train-lines", type=int, help="train on the first N lines")
    train.add_argument("--attention", help=" | ".join(SCORER_NAMES))
    train.add_argument("--src-lang")
    train.add_argument("--tgt-lang")
    train.add_argument("--seed", type=int)


def add_prepare(sub: argparse._SubParsersAction) -> None:
    prepare = sub.add_parser("prepare", help="check, tokenize and cache a corpus (train does it "
                             "too when needed)", epilog="Any config key: --section.key VALUE.")
    prepare.add_argument("--config", help="YAML config, e.g. configs/transformer.yaml")
    for flag in ("train_lines", "src_lang", "tgt_lang"):
        prepare.add_argument("--" + flag.replace("_", "-"), type=int if flag == "train_lines" else str)


def add_decoding(sub: argparse._SubParsersAction) -> None:
    """``translate`` and ``evaluate``, which share the decoding options."""
    for name, help_text in (("translate", "translate lines from stdin or a file"),
                            ("evaluate", "BLEU and chrF of a run on a corpus split")):
        p = sub.add_parser(name, help=help_text)
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
    export.add_argument("--checkpoint", required=True, help="run directory")
    export.add_argument("--format", default="ctranslate2", help="ctranslate2")
    export.add_argument("--quantization", default="float32", help="float32 | int8")
    export.add_argument("--out", required=True, help="new directory (or an earlier export, replaced)")


def add_average(sub: argparse._SubParsersAction) -> None:
    average = sub.add_parser("average", help="average the weights of a run's last checkpoints")
    average.add_argument("--checkpoint", required=True, help="run directory, e.g. checkpoints/<run>")
    average.add_argument("--last", type=int, help="the last N kept checkpoints (default all)")
    average.add_argument("--out", help="output file (default RUN/averaged.ckpt)")


def add_compare(sub: argparse._SubParsersAction) -> None:
    compare = sub.add_parser("compare", help="the attention study: families x scorers x seeds",
                             epilog="Other config keys apply to every cell: --section.key VALUE.")
    compare.add_argument("--config", default="configs/compare.yaml")
    compare.add_argument("--preset", default="quick", help="quick | full | study (see the config)")
    compare.add_argument("--seeds", type=int, help="seeds per cell in every group (default: the preset's)")
    compare.add_argument("--out", help="records, tables and figures (default study/<preset>)")
    compare.add_argument("--runs", help="the cells' run directories (default checkpoints/study/<preset>)")
    compare.add_argument("--tables-only", action="store_true",
                         help="train nothing: rebuild tables and figures from the records")
    compare.add_argument("--cost", action="store_true",
                         help="train nothing: bench each scorer's training cost (on a quiet "
                              "machine), write <out>/cost.json, rebuild the tables")
    compare.add_argument("--jobs", type=int, default=1,
                         help="cells trained at once, each in its own process with an equal share of "
                              "the CPU threads (for a GPU that one small cell leaves idle; default 1)")
    compare.add_argument("--train-lines", type=int)
    compare.add_argument("--max-epochs", type=int)
    compare.add_argument("--src-lang")
    compare.add_argument("--tgt-lang")


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print numbers (and a JSON line)")
    what = bench.add_subparsers(dest="what", required=True)
    for add_bench_command in (add_bench_train, add_bench_decode, add_bench_data, add_bench_attention):
        add_bench_command(what)


def add_bench_train(what: argparse._SubParsersAction) -> None:
    bench_train = what.add_parser("train", help="training tokens/s, FLOPs and utilisation")
    bench_train.add_argument("--config", required=True)
    bench_train.add_argument("--steps", type=int, default=30, help="timed optimizer steps")
    bench_train.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    for flag in ("train_lines", "src_lang", "tgt_lang", "seed"):
        bench_train.add_argument("--" + flag.replace("_", "-"),
                                 type=int if flag in ("train_lines", "seed") else str)
    bench_train.add_argument("--attention", help=" | ".join(SCORER_NAMES))


def add_bench_decode(what: argparse._SubParsersAction) -> None:
    bench_decode = what.add_parser("decode", help="greedy and beam search speed on a split")
    bench_decode.add_argument("--checkpoint", required=True, help="run directory")
    bench_decode.add_argument("--beam", default="1,5", help="comma-separated beam sizes")
    bench_decode.add_argument("--split", default="test")
    bench_decode.add_argument("--limit", type=int, help="first N sentences only")
    bench_decode.add_argument("--repeat", type=int, default=3,
                              help="timed passes per setting, taken in turn; the fastest counts")
    bench_decode.add_argument("--engine", default="torch",
                              help="comma-separated: torch, ctranslate2 (the run exported in float32)")
    bench_decode.add_argument("--precision", default="auto",
                              help="comma-separated torch decoding precisions: "
                              + ", ".join(DECODING_PRECISIONS))


def add_bench_data(what: argparse._SubParsersAction) -> None:
    bench_data = what.add_parser("data", help="prepare and training start-up on a synthetic "
                                 "corpus of N pairs", epilog="Config keys: --section.key VALUE.")
    bench_data.add_argument("--pairs", type=int, default=100_000)
    bench_data.add_argument("--config", default="configs/transformer.yaml")
    bench_data.add_argument("--steps", type=int, default=5, help="timed training steps")
    bench_data.add_argument("--join", type=int, default=1,
                            help="Multi30k pairs per line (2: ~25 words a side, like WMT)")
    bench_data.add_argument("--dir", default="results/bench_data",
                            help="where the corpus and its prepared folder go")


def add_bench_attention(what: argparse._SubParsersAction) -> None:
    bench_attention = what.add_parser("attention", help="each scorer's cost as length grows")
    bench_attention.add_argument("--max-len", type=int, default=1024)
    bench_attention.add_argument("--batch", type=int, default=2)
    bench_attention.add_argument("--heads", type=int, default=4)
    bench_attention.add_argument("--head-dim", type=int, default=32)
    bench_attention.add_argument("--plot", default="results/bench_attention.png",
                                 help="log-log plot of time against length")


def main(argv: list[str] | None = None) -> int:
    args, extra = parser().parse_known_args(argv)
    keep_freed_memory()
    try:
        if args.command == "train":
            cmd_train(args, extra)
        elif args.command == "prepare":
            cmd_prepare(args, extra)
        elif args.command == "bench":
            cmd_bench(args, extra)
        elif args.command == "compare":
            cmd_compare(args, extra)
        elif extra:
            raise NMTError(f"unrecognized arguments: {' '.join(extra)}")
        elif args.command == "translate":
            cmd_translate(args)
        elif args.command == "serve":
            cmd_serve(args)
        elif args.command == "export":
            cmd_export(args)
        elif args.command == "average":
            cmd_average(args)
        else:
            cmd_evaluate(args)
    except NMTError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
