"""What scoring a large test set costs in memory: BLEU and chrF of N lines, scored at once
(sacreBLEU's ``corpus_score``, which caches every reference's n-grams first) and in parts of
``nmt.metrics.SCORED_AT_ONCE`` lines (``nmt.metrics.score_corpus``), each in its own process.

    python scripts/bench_scoring_memory.py [--lines 100000] [--file data/multi30k/train.en.gz]

The references are the file's lines (repeated up to N), the hypotheses the same lines shifted
by one: a low score with matches to count. Prints each way's peak RSS above the peak before
scoring (imports and input read), its time and its scores, which must be the same.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import time

from nmt.cli.options import positive_int
from nmt.data.text_files import read_lines
from nmt.errors import NMTError, run_script


def repeated_lines(path: str, count: int) -> list[str]:
    """The file's lines, repeated up to ``count``."""
    try:
        lines = [line for chunk in read_lines(path) for line in chunk]
    except OSError as err:
        raise NMTError(f"{path}: {err.strerror or err}") from None
    if not lines:
        raise NMTError(f"{path} has no lines")
    return list(itertools.islice(itertools.cycle(lines), count))


def measure(way: str, path: str, count: int) -> dict:
    """One way of scoring, in this process: its peak RSS growth, time and scores."""
    import nmt.metrics

    references = repeated_lines(path, count)
    hypotheses = references[1:] + references[:1]
    if way == "at once":
        nmt.metrics.SCORED_AT_ONCE = count
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    scores = nmt.metrics.score_corpus(hypotheses, references)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"way": way, "peak_rss_growth_mb": round((peak - before) / 1024),
            "seconds": round(time.perf_counter() - start, 1),
            "bleu": scores["bleu"], "chrf": scores["chrf"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=positive_int, default=100_000)
    parser.add_argument("--file", default="data/multi30k/train.en.gz")
    parser.add_argument("--way", help=argparse.SUPPRESS)  # the child process's one measurement
    args = parser.parse_args()
    if args.way:
        print(json.dumps(measure(args.way, args.file, args.lines)))
        return
    repeated_lines(args.file, 1)  # a missing file: one line, before any process starts
    for way in ("at once", "in parts"):
        child = subprocess.run([sys.executable, __file__, "--way", way, "--file", args.file,
                                "--lines", str(args.lines)], capture_output=True, text=True)
        if child.returncode:
            raise NMTError(f"the '{way}' measurement failed: {child.stderr.strip()}")
        row = json.loads(child.stdout)
        print(f"{args.lines:,} lines scored {way}: peak RSS +{row['peak_rss_growth_mb']:,} MB, "
              f"{row['seconds']} s, BLEU {row['bleu']}, chrF {row['chrf']}")


if __name__ == "__main__":
    run_script(main)
