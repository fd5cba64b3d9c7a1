"""What does `nmt translate --buffer-lines N` cost? The translator sorts each chunk's lines by
length into batches, so small chunks leave more padding and more part-full batches.

    python scripts/bench_translate_chunks.py RUN [--copies 10] [--chunks 100,1000,10000] [--beams 1,5]

The run's test split, repeated ``--copies`` times and shuffled (seed 0), translated in chunks
of each size as ``nmt translate`` does, one Translator, the sizes alternating, ``--rounds``
rounds.
"""

from __future__ import annotations

import argparse
import random
import time

from nmt.allocator import keep_freed_memory
from nmt.data.corpus import load_corpus
from nmt.errors import run_script
from nmt.translator import Translator


def translate_in_chunks(translator: Translator, lines: list[str], size: int, beam: int) -> float:
    """Seconds to translate ``lines`` ``size`` at a time."""
    start = time.perf_counter()
    for first in range(0, len(lines), size):
        translator.translate(lines[first:first + size], beam, first_line=first + 1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("run", help="run directory (config.yaml, spm.model, checkpoints)")
    parser.add_argument("--copies", type=int, default=10, help="times the test split is repeated")
    parser.add_argument("--chunks", default="100,1000,10000", help="--buffer-lines values")
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    keep_freed_memory()  # as the nmt command does
    translator = Translator.from_run_dir(args.run)
    print(f"precision: {translator.precision.precision} ({translator.precision.reason})")
    lines = list(load_corpus(translator.config.data)["test"]["src"]) * args.copies
    random.Random(0).shuffle(lines)
    translator.translate(lines[:200], 5)  # warm-up
    for beam in (int(b) for b in args.beams.split(",")):
        for round_ in range(args.rounds):
            for size in (int(c) for c in args.chunks.split(",")):
                seconds = translate_in_chunks(translator, lines, size, beam)
                print(f"beam {beam} round {round_} chunk {size}: {seconds:.1f} s, "
                      f"{len(lines) / seconds:.0f} sent/s", flush=True)


if __name__ == "__main__":
    run_script(main)
