"""Where does decoding time go? torch.profiler over greedy and beam search of a test split.

    python scripts/profile_decode.py RUN [--precision 32-true] [--beam 1,5] [--limit N]

Prints, per beam size, the wall time of one pass and the operators by self CPU time, so the
cost of beam search can be set against greedy's operator by operator (e.g. log_softmax over
the vocabulary, the key/value caches' growth and reordering).
"""

from __future__ import annotations

import argparse
import time

from torch.profiler import ProfilerActivity, profile

from nmt.allocator import keep_freed_memory
from nmt.data.corpus import load_corpus
from nmt.errors import run_script
from nmt.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("run", help="run directory (best.ckpt, config.yaml, spm.model)")
    parser.add_argument("--precision", default="auto", help="auto, 32-true or bf16-mixed")
    parser.add_argument("--beam", default="1,5", help="comma-separated beam sizes")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None, help="first N sentences only")
    parser.add_argument("--rows", type=int, default=18, help="operators shown")
    args = parser.parse_args()
    keep_freed_memory()  # as the nmt command does: else every large tensor is page-faulted anew

    translator = Translator.from_run_dir(args.run, precision=args.precision)
    lines = list(load_corpus(translator.config.data)[args.split]["src"])[: args.limit]
    print(f"{len(lines)} sentences, precision {translator.precision.precision}")
    for beam in (int(b) for b in args.beam.split(",")):
        translator.translate(lines[:200], beam_size=beam)  # warm-up
        start = time.perf_counter()
        translator.translate(lines, beam_size=beam)
        print(f"\nbeam {beam}: {time.perf_counter() - start:.2f} s unprofiled")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            translator.translate(lines, beam_size=beam)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    run_script(main)
