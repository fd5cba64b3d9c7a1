"""Does a smaller decoding batch make beam search cheaper against greedy? Beam search decodes
beam x the rows of greedy, so its (rows, vocabulary) scores leave the cache; a token budget
divided by the beam keeps them as small as greedy's.

    python scripts/bench_beam_budget.py RUN [--precision 32-true] [--budgets 8000,4000,1600]

Greedy and beam 5 over test2016 at each budget (data.eval_max_tokens), alternating, best of 3.
"""

from __future__ import annotations

import argparse
import time

from nmt.allocator import keep_freed_memory
from nmt.data.corpus import load_corpus
from nmt.errors import run_script
from nmt.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("run", help="run directory (best.ckpt, config.yaml, spm.model)")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--budgets", default="8000,4000,1600", help="decoding token budgets")
    args = parser.parse_args()
    keep_freed_memory()  # as the nmt command does: else every large tensor is page-faulted anew
    budgets = [int(b) for b in args.budgets.split(",")]

    translator = Translator.from_run_dir(args.run, precision=args.precision)
    lines = list(load_corpus(translator.config.data)["test"]["src"])
    translator.translate(lines[:200], beam_size=5)  # warm-up
    best: dict[tuple[int, int], float] = {}
    for _ in range(3):
        for budget in budgets:
            for beam in (1, 5):
                translator.config.data.eval_max_tokens = budget
                start = time.perf_counter()
                translator.translate(lines, beam_size=beam)
                seconds = time.perf_counter() - start
                best[budget, beam] = min(best.get((budget, beam), seconds), seconds)
    for budget in budgets:
        greedy, beam = best[budget, 1], best[budget, 5]
        print(f"{args.precision} budget {budget}: greedy {len(lines) / greedy:.1f} sent/s, "
              f"beam 5 {len(lines) / beam:.1f} sent/s, beam / greedy time {beam / greedy:.2f}")


if __name__ == "__main__":
    run_script(main)
