"""``nmt translate | evaluate | average | serve | export``: the commands that use a trained run."""

from __future__ import annotations

import argparse
import codecs
import functools
import gzip
import io
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import BinaryIO

from nmt.cli.options import path_option, positive_int
from nmt.config import DECODING_PRECISIONS, DecodingConfig, load_config, run_config
from nmt.errors import NMTError, stopped_cleanly
from nmt.files import (
    GZIP_ERRORS,
    atomic_path,
    made_folders_removed_on_failure,
    open_bytes,
    require_export,
    what_it_is,
)

# Lines translated together: the translator sorts them by length into batches, so larger
# chunks waste less padding; smaller ones show output sooner (docs/performance.md).
BUFFER_LINES = 10_000
# What --plot-attention draws, unless these options say otherwise.
PICTURE_DEFAULTS = {"attention_kind": "cross", "attention_layer": -1, "attention_head": "mean"}
PICTURES = "[0-9][0-9][0-9][0-9]*.png"  # their names: the input's line number, 0001.png on


def add_decoding(sub: argparse._SubParsersAction) -> None:
    """``translate`` and ``evaluate``, which share the decoding options."""
    for name, help_text, command in (
            ("translate", "translate lines from stdin or a file", cmd_translate),
            ("evaluate", "BLEU and chrF of a run on a corpus split", cmd_evaluate)):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(run_command=command)
        p.add_argument("--checkpoint", required=True, type=path_option,
                       help="run directory, e.g. checkpoints/<run>")
        p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
        p.add_argument("--alpha", type=float, default=None,
                       help="GNMT length penalty exponent, from 0 (none) to 10")
        p.add_argument("--prune-margin", help="drop beams more than this many nats below the "
                                              "best (none: keep all K; default: the run's)")
        p.add_argument("--device", default=None,
                       help="cpu | cuda | cuda:N (default: cuda if available; cpu for ctranslate2)")
        p.add_argument("--engine", default="torch",
                       help="torch | ctranslate2 (--checkpoint: a folder from nmt export)")
        p.add_argument("--weights", type=path_option,
                       help="checkpoint file in the run directory (or a path), e.g. "
                            "best.ckpt (default: the one training chose); with "
                            "--ensemble, in each run")
        p.add_argument("--ensemble", nargs="+", type=path_option, default=[], metavar="RUN",
                       help="more run directories (same SentencePiece model) to decode with: "
                            "the mean of the runs' next-piece probabilities")
        p.add_argument("--precision", choices=DECODING_PRECISIONS,
                       help="decoding precision (default: the run's decoding.precision, auto)")
    translate = sub.choices["translate"]
    translate.add_argument("--input", type=path_option, help="input file, .gz too (default or -: stdin)")
    translate.add_argument("--output", type=path_option, help="output file (default or -: stdout)")
    translate.add_argument("--nbest", type=int, help="hypotheses per line, in Moses' n-best "
                           "format where more than 1 (default: the run's decoding.nbest, 1)")
    translate.add_argument("--buffer-lines", type=positive_int, default=BUFFER_LINES,
                           help="translate and write the input this many lines at a time "
                                f"(default {BUFFER_LINES}; 1: each line as it arrives)")
    translate.add_argument("--alignment", action="store_true",
                           help="append each translation's word alignment, read off its "
                                "cross-attention: 'text ||| 0-0 1-2 ...' (source-target words; "
                                "Transformer: the last layer's mean over heads, or "
                                "--attention-layer and --attention-head)")
    translate.add_argument("--plot-attention", type=path_option, metavar="DIR",
                           help="write a heatmap PNG of each sentence's attention to DIR")
    translate.add_argument("--attention-kind", choices=("cross", "encoder", "decoder"),
                           help="with --plot-attention: cross-attention (default), or the "
                                "Transformer's encoder or decoder self-attention")
    translate.add_argument("--attention-layer", type=int,
                           help="with --plot-attention or --alignment, Transformer: which layer, "
                                "from 0 (default -1, the last)")
    translate.add_argument("--attention-head",
                           help="with --plot-attention or --alignment, Transformer: mean over "
                                "heads (default), a head number from 0, or (pictures) all, one "
                                "panel each")
    evaluate = sub.choices["evaluate"]
    evaluate.add_argument("--split", help="train | val | test (default test)")
    evaluate.add_argument("--files", nargs=2, type=path_option, metavar=("SRC", "REF"),
                          help="score on these files instead of a split of the run's corpus: a "
                               "source file and its reference translations, line by line")


def open_translator(args: argparse.Namespace, sentences: int | None = None):
    """The engine's translator for ``--checkpoint``; ``--prune-margin`` (a number of nats,
    or none for the full beam) replaces the run's decoding.prune_margin. ``sentences``: how
    many are decoded together at most, for ``--precision auto`` (default: a full batch), which
    decides at ``--beam`` (default: the run's)."""
    from nmt.engines import load_translator

    translator = load_translator(args.checkpoint, args.engine, args.device, args.weights,
                                 args.precision, sentences, args.beam, args.ensemble)
    if args.prune_margin is not None:  # check_decoding_args refused it for ctranslate2
        translator.config.decoding.prune_margin = parse_margin(args.prune_margin)
    return translator


def check_decoding_args(args: argparse.Namespace, nbest: int | None) -> int:
    """--beam, --alpha, --prune-margin and ``nbest`` (translate's --nbest; None: the run's
    decoding.nbest) checked against the run's decoding options before its model loads and
    ``--precision auto`` times it (seconds, longer for an ensemble): a bad one was an error
    only after that. Returns the n-best size."""
    from nmt.engines import check_engine_options
    from nmt.translator import decoding_options

    check_engine_options(args.engine, args.weights, args.precision, args.ensemble)
    decoding = run_decoding(args.checkpoint, args.engine)
    if args.prune_margin is not None:
        if args.engine != "torch":
            raise NMTError("--prune-margin is for the torch engine")
        decoding.prune_margin = parse_margin(args.prune_margin)
    if nbest is None:
        nbest, beam = decoding.nbest, args.beam or decoding.beam_size
        if 1 <= beam < nbest:  # a beam below 1 is decoding_options' error
            raise NMTError(f"the run's decoding.nbest {nbest} is more than the beam {beam}: "
                           "give --nbest (1 for one translation a line)")
    decoding_options(decoding, args.beam, nbest, args.alpha)
    return nbest


def run_decoding(checkpoint: str, engine: str) -> DecodingConfig:
    """The decoding options of ``checkpoint``: a training run's config.yaml, or for the
    ctranslate2 engine the copy an export keeps beside its model."""
    if engine == "torch":
        return run_config(checkpoint).decoding
    require_export(checkpoint)
    return load_config(Path(checkpoint) / "config.yaml").decoding


def parse_margin(text: str) -> float | None:
    """``--prune-margin``: a number of nats >= 0, or none (the full beam)."""
    try:
        margin = None if text == "none" else float(text)
        if margin is not None and not margin >= 0:  # NaN too
            raise ValueError(text)
    except ValueError:
        raise NMTError(f"--prune-margin must be a number >= 0 or none, got '{text}'") from None
    return margin


def open_input(path: str | None) -> AbstractContextManager[BinaryIO]:
    """The input as bytes: a file (``.gz`` decompressed, as corpus files are), a pipe such
    as /dev/stdin, or stdin (left open after)."""
    try:
        if not path:
            return nullcontext(sys.stdin.buffer)
        return open_bytes(path)
    except OSError as err:
        raise NMTError(f"cannot read {path}: {err.strerror}") from None


def input_chunks(stream: BinaryIO, size: int, name: str = "stdin") -> Iterator[list[str]]:
    """The lines of ``stream`` (called ``name`` in errors) as text, ``size`` at a time, each
    chunk as soon as its lines have arrived; a line that is not UTF-8 is an error naming it."""
    chunk = []
    try:
        for number, raw in enumerate(stream, start=1):  # split on \n only, as files are written
            if number == 1:  # a byte-order mark is not text
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                chunk.append(raw.removesuffix(b"\n").removesuffix(b"\r").decode("utf-8"))
            except UnicodeDecodeError as err:
                hint = what_it_is(raw, stdin=name == "stdin") if number == 1 else ""
                raise NMTError(f"{name}, line {number}: not valid UTF-8 "
                               f"(byte {err.start} of the line){hint}") from None
            if len(chunk) == size:
                yield chunk
                chunk = []
    except GZIP_ERRORS as err:  # before OSError: gzip.BadGzipFile is one
        raise NMTError(f"{name}: damaged gzip file ({err})") from None
    except OSError as err:  # a disk or a terminal failing part of the way
        raise NMTError(f"cannot read {name}: {err.strerror}") from None
    if chunk:
        yield chunk


def write_stream(text: str, name: str = "stdout") -> None:
    """Write to ``sys.stdout`` (or ``sys.stderr``) and flush at once, so that a program reading
    our output sees each chunk when it is done. A reader that has gone (``| head``) ends the
    command quietly, as Unix tools do on SIGPIPE."""
    stream = getattr(sys, name)
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # no error at exit's flush
        raise SystemExit(128 + signal.SIGPIPE) from None


@contextmanager
def output_writer(path: str | None) -> Iterator[Callable[[str], object]]:
    """Where each chunk's translations go once done: stdout; or a file (gzipped where its name
    ends in .gz) written beside ``path`` and renamed over it only when the whole input is
    translated, so an error part of the way leaves an earlier ``path`` whole."""
    name = written_through(path)
    if name is not None:  # /dev/stdout, /proc/self/fd/2, the file > sends stdout to: through the
        # stream itself, as opened anew it would be truncated, or written from its start over
        # what the shell wrote before and after (>>, { ...; } > file)
        if getattr(sys, name) is None:  # started with it closed (>&-): /dev/null holds its place
            raise NMTError(f"{name} is closed: give --output FILE")
        yield functools.partial(write_stream, name=name)
        return
    with atomic_path(path) as tmp, open(tmp, "wb") as raw:
        # a .gz name is written gzipped, as --input reads it (a plain text so named was then
        # refused as a damaged gzip file); its header names the file, not the temporary one,
        # and no time (mtime 0, as gzip -n): the same translations give the same bytes
        binary = gzip.GzipFile(Path(path).name, "wb", fileobj=raw, mtime=0) \
            if path.endswith(".gz") else raw
        with io.TextIOWrapper(binary, encoding="utf-8") as out:
            yield out.write


def written_through(path: str | None) -> str | None:
    """The stream (stdout or stderr) an --output ``path`` (None: stdout) is written through,
    as each chunk is done; None for a file, renamed into place at the end."""
    return "stdout" if path is None else own_stream(path)


def own_stream(path: str) -> str | None:
    """"stdout" or "stderr" where ``path`` is what this process' fd 1 or 2 writes to; else None."""
    try:
        target = os.stat(path)
    except OSError:  # no such file yet
        return None
    for fd, name in ((1, "stdout"), (2, "stderr")):
        with suppress(OSError):
            if os.path.samestat(target, os.fstat(fd)):
                return name
    return None


def cmd_translate(args: argparse.Namespace) -> None:
    if args.input in (None, "-") and sys.stdin is None:  # started with stdin closed (<&-)
        raise NMTError("stdin is closed: give --input FILE")
    args.input, args.output = (None if path == "-" else path for path in (args.input, args.output))
    picture_options(args)
    check_output_is_not_input(args.input, args.output)
    args.nbest = check_decoding_args(args, args.nbest)
    if args.alignment and args.nbest > 1:
        raise NMTError("--alignment is written beside the best translation alone: translate "
                       "with --nbest 1 (n-best rows keep Moses' four fields)")
    check_picture_choice(args)
    # The input, the output and the picture folder are opened before the model loads and
    # --precision auto times it (seconds, more for an ensemble): a mistyped --input, or a
    # --plot-attention folder that cannot be made, was an error only after that
    with open_input(args.input) as stream, output_writer(args.output) as write, \
            attention_pictures(args, streamed=written_through(args.output) is not None):
        translator = open_translator(args, sentences=args.buffer_lines)
        first = 1  # the input's number of the chunk's first line
        for lines in input_chunks(stream, args.buffer_lines, args.input or "stdin"):
            write(translate_chunk(translator, lines, first, args))
            first += len(lines)


def check_output_is_not_input(source: str | None, output: str | None) -> None:
    """The translations would replace the text they translate, or grow it without end
    (``< f >> f``): a one-line error instead, as cat's "input file is output file". The input
    is ``source``, else what stdin reads; the output ``output``, else what stdout writes to.
    A link to it too; not /dev/stdin and /dev/stdout in a terminal, which is no file."""
    try:
        read = os.stat(source) if source else os.fstat(0)
        written = os.stat(output) if output else os.fstat(1)
    except OSError:  # no such input (its own error), no output yet
        return
    if stat.S_ISREG(read.st_mode) and os.path.samestat(read, written):
        where = f"--output {output}" if output else "stdout"
        raise NMTError(f"{where} is the input file{'' if source else ' (stdin)'}: the "
                       "translations would replace or extend the text they translate; write them "
                       "to another file")


def translate_chunk(translator, lines: list[str], first: int, args: argparse.Namespace) -> str:
    """The output for ``lines``, lines ``first``... of the input: one translation per line
    (with --alignment, its word pairs after " ||| "), or Moses n-best rows; with
    --plot-attention, their pictures too."""
    from nmt.translator import moses_nbest

    need_attn = args.plot_attention is not None or args.alignment
    results = translator.translate(lines, args.beam, args.nbest, args.alpha, need_attn,
                                   first_line=first)
    if args.plot_attention is not None:
        from nmt.plots import plot_attention

        plot_attention(translator, lines, results, args.plot_attention, args.attention_kind,
                       args.attention_layer, args.attention_head, first_line=first)
    if args.nbest > 1:
        rows = moses_nbest(results, first_id=first - 1)
    elif args.alignment:
        from nmt.alignment import aligned

        rows = [f"{hyps[0].text} ||| " + aligned(hyps[0], line, translator.tokenizer,
                                                 args.attention_layer, args.attention_head)
                for line, hyps in zip(lines, results)]
    else:
        rows = [hyps[0].text for hyps in results]
    return "".join(row + "\n" for row in rows)


def picture_options(args: argparse.Namespace) -> None:
    """--attention-kind, -layer and -head choose what --plot-attention draws, and -layer and
    -head which cross-attention map --alignment reads: given without the option that reads
    them they are an error (they would be ignored); the ones not given take their defaults."""
    if args.plot_attention is not None and args.ensemble:
        raise NMTError("--plot-attention draws one model's attention: translate with that run "
                       "alone, without --ensemble")
    if args.alignment and args.ensemble:
        raise NMTError("--alignment reads one model's attention: translate with that run alone, "
                       "without --ensemble")
    given = [name for name in PICTURE_DEFAULTS if getattr(args, name) is not None]
    if args.alignment and args.attention_kind not in (None, "cross"):
        raise NMTError("--alignment always reads the cross-attention: --attention-kind "
                       f"{args.attention_kind} is for --plot-attention without --alignment")
    if args.alignment and args.attention_head == "all":
        raise NMTError("--attention-head all draws one panel per head, for --plot-attention "
                       "without --alignment: give mean or a head number")
    for name in given:
        if args.plot_attention is None and not args.alignment:
            option = "--" + name.replace("_", "-")
            if name == "attention_kind":
                raise NMTError(f"{option} chooses what --plot-attention DIR draws: give both, or neither")
            raise NMTError(f"{option} chooses what --plot-attention DIR draws or --alignment reads: "
                           "give one of those with it, or leave it out")
    for name, default in PICTURE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


def check_picture_choice(args: argparse.Namespace) -> None:
    """--attention-kind, -layer and -head (with --plot-attention or --alignment) checked against
    the run's model before it loads and --precision auto times it (seconds, more for an
    ensemble): a layer it lacks was an error only after that. The layout is read from the model
    its config builds on the meta device (no weights); an export's is CTranslate2's one map."""
    if args.plot_attention is None and not args.alignment:
        return
    from nmt.attention_stats import attention_layout, check_attention_choice, shape_model

    model = shape_model(run_config(args.checkpoint).model) if args.engine == "torch" else None
    layers, heads = attention_layout(model, args.attention_kind)
    check_attention_choice(layers, heads, args.attention_layer, args.attention_head,
                           engine=args.engine)


@contextmanager
def attention_pictures(args: argparse.Namespace, streamed: bool) -> Iterator[None]:
    """The block that loads the model and translates, with --plot-attention's folder made
    first (``make_picture_folder``). Where the block fails or is stopped and the
    translations go to a file, which is then not written, the pictures it drew go too: left,
    they made the same command run again refuse the folder as holding an earlier input's
    pictures. Translations ``streamed`` (written through to stdout as each chunk is done, then
    stopped with Ctrl-C, say) keep their pictures. The folders made for them go where they
    are left empty (the model failed to load, say)."""
    if args.plot_attention is None:
        yield
        return
    folder = Path(args.plot_attention)
    with made_folders_removed_on_failure(folder / PICTURES):  # the folder and those above it
        make_picture_folder(args.plot_attention)  # the folder holds no pictures now
        try:
            yield
        except BaseException:
            if not streamed:
                for picture in folder.glob(PICTURES):
                    picture.unlink(missing_ok=True)
            raise


def make_picture_folder(name: str) -> None:
    """Make --plot-attention's folder ``name`` before anything is translated (a place it
    cannot go fails at once, not after the whole input); one holding pictures is refused."""
    folder = Path(name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        earlier = sorted(p.name for p in folder.glob(PICTURES))
    except OSError as err:
        raise NMTError(f"--plot-attention {name}: cannot make a folder there "
                       f"({err.strerror})") from None
    if earlier:  # they would stand beside the new ones as if of this input
        raise NMTError(f"--plot-attention {name} holds pictures of an earlier "
                       f"input ({earlier[0]}, ...): name a new folder, or empty this one")


def cmd_evaluate(args: argparse.Namespace) -> None:
    from nmt.evaluate import (
        decoding_record,
        eval_file_stem,
        evaluate_split,
        evaluation_pairs,
        evaluation_writer,
        files_name,
        margin_name,
    )

    if args.split and args.files:
        raise NMTError("--split and --files both name what to score: give one")
    check_decoding_args(args, nbest=1)
    run_dir = Path(args.checkpoint)
    split = args.split or "test"
    # Before the model and the precision probe: a run trained on named files without
    # data.test_files said it has no test split after seconds of probing
    pairs = evaluation_pairs(run_config(run_dir).data, split, args.files)
    translator = open_translator(args)
    record = decoding_record(translator, run_dir, args.beam, args.alpha)
    # each option given gets its own files, unless they would hold the default's results: the
    # option is the run's own decoding option (--precision auto of an auto run), or the
    # decoding left it unused (greedy's alpha and margin: not in the record)
    own = run_decoding(args.checkpoint, args.engine)
    alpha = args.alpha if "alpha" in record and args.alpha != own.alpha else None
    precision = args.precision if args.precision != own.precision else None
    margin = (margin_name(record["prune_margin"]) if args.prune_margin and "prune_margin" in record
              and record["prune_margin"] != own.prune_margin else None)
    weights = record.get("weights") if args.weights else None  # inside the run: relative
    name = files_name(*args.files) if args.files else split
    device = record["device"] if args.device else None  # as decoded on: --device cuda is cuda:0
    stem = eval_file_stem(name, record["beam"], weights, alpha, precision, margin,
                          record.get("ensemble", []), device)
    with evaluation_writer(run_dir / "eval", stem) as write:
        hyps, scores = evaluate_split(translator, split, pairs, record, args.files)
        write(hyps, scores)
    print(f"BLEU = {scores['bleu']:.2f}  {scores['bleu_signature']}")
    print(f"chrF = {scores['chrf']:.2f}  {scores['chrf_signature']}")
    # named in full: each option given gets its own files, and "eval/" alone left the user to
    # work out which of them this evaluation wrote
    print(f"hypotheses and scores written to {run_dir / 'eval' / stem}.{{hyp,json}}")


def add_average(sub: argparse._SubParsersAction) -> None:
    average = sub.add_parser("average", help="average the weights of a run's last checkpoints")
    average.set_defaults(run_command=cmd_average)
    average.add_argument("--checkpoint", required=True, type=path_option,
                         help="run directory, e.g. checkpoints/<run>")
    average.add_argument("--last", type=int, help="the last N kept checkpoints (default all)")
    average.add_argument("--out", type=path_option, help="output file (default RUN/averaged.ckpt)")


def cmd_average(args: argparse.Namespace) -> None:
    from nmt.average import average_run

    out, paths = average_run(args.checkpoint, args.last, args.out)
    count = "1 checkpoint" if len(paths) == 1 else f"{len(paths)} checkpoints"
    short = f" (--last {args.last}: the run kept only {len(paths)})" if (args.last or 0) > len(paths) else ""
    print(f"averaged {count} ({', '.join(p.name for p in paths)}) into {out}{short}")


def add_serve(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="translate over HTTP, with a web page of the attention")
    serve.set_defaults(run_command=cmd_serve, own_signals=True)
    serve.add_argument("--checkpoint", required=True, nargs="+", type=path_option,
                       help="run directories (exported models with --engine ctranslate2)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="127.0.0.1 (default; or localhost), 0.0.0.0 or ::")
    serve.add_argument("--port", type=int, default=8000, help="default 8000")
    serve.add_argument("--beam", type=int, default=5, help="beam size when a request names none")
    serve.add_argument("--engine", default="torch", help="torch | ctranslate2")
    serve.add_argument("--max-batch", type=int, default=32, help="requests decoded together")
    serve.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                       help="a request that has waited this long when the worker comes to it "
                            "is answered 504 (0: never)")
    serve.add_argument("--weights", type=path_option,
                       help="checkpoint file in each run directory (default: the "
                            "one training chose)")
    serve.add_argument("--precision", choices=DECODING_PRECISIONS,
                       help="decoding precision (default: each run's decoding.precision, auto)")
    serve.add_argument("--ensemble", nargs="+", type=path_option, default=[], metavar="RUN",
                       help="more run directories that decode with the one --checkpoint, served "
                            "as one model named after it (as translate's --ensemble)")


def cmd_serve(args: argparse.Namespace) -> None:
    # SIGTERM as Ctrl-C, and either a clean end, from the start: serve() ends so, but torch and
    # LitServe import before it runs (seconds), and a supervisor's stop then killed it (143)
    with stopped_cleanly():
        try:
            from nmt.serve import serve
        except ImportError:
            raise NMTError('nmt serve needs LitServe: pip install -e ".[serve]"') from None
        serve(args.checkpoint, args.host, args.port, args.engine, args.beam, args.max_batch,
              args.weights, args.precision, args.ensemble, args.timeout)


def add_export(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser("export", help="convert a Transformer run for another inference engine")
    export.set_defaults(run_command=cmd_export)
    export.add_argument("--checkpoint", required=True, type=path_option, help="run directory")
    export.add_argument("--format", default="ctranslate2", help="ctranslate2")
    export.add_argument("--quantization", default="float32", help="float32 | int8")
    export.add_argument("--out", required=True, type=path_option,
                        help="new directory (or an earlier export, replaced)")
    export.add_argument("--weights", type=path_option,
                        help="checkpoint file in the run directory (default: the "
                             "run's final weights, as translate)")


def cmd_export(args: argparse.Namespace) -> None:
    if args.format != "ctranslate2":
        raise NMTError(f"unknown export format '{args.format}'; available: ctranslate2")
    try:
        from nmt.export import export_ctranslate2
    except ImportError:
        raise NMTError('nmt export needs CTranslate2: pip install -e ".[export]"') from None
    out = export_ctranslate2(args.checkpoint, args.out, args.quantization, args.weights)
    print(f"CTranslate2 model ({args.quantization}) written to {out}/; use it with "
          f"nmt translate --engine ctranslate2 --checkpoint {out}")
