"""What does beam pruning (decoding.prune_margin) buy? Greedy and beam search over a split
at each prune margin, alternating in one process, fastest of N passes each.

    python scripts/bench_beam_pruning.py RUN [--margins none,3,2] [--beam 5] [--passes 3]
        [--precision 32-true] [--split test] [--alpha A]

Per margin: sentences/s, time against greedy, decoder rows decoded (every row of every
step), BLEU, and how many outputs equal the full beam's (the first margin's).
"""

from __future__ import annotations

import argparse
import time

from nmt.allocator import keep_freed_memory
from nmt.bench import count_rows
from nmt.data.corpus import load_corpus
from nmt.errors import run_script
from nmt.metrics import score_corpus
from nmt.translator import Translator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("run", help="run directory (best.ckpt, config.yaml, spm.model)")
    parser.add_argument("--margins", default="none,3,2", help="prune margins in nats; none: full beam")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--split", default="test")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--alpha", type=float, default=None, help="length penalty (default: the run's)")
    args = parser.parse_args()
    keep_freed_memory()  # as the nmt command does: else every large tensor is page-faulted anew
    margins = [None if m == "none" else float(m) for m in args.margins.split(",")]

    translator = Translator.from_run_dir(args.run, precision=args.precision)
    corpus = load_corpus(translator.config.data)[args.split]
    lines, refs = list(corpus["src"]), list(corpus["tgt"])
    rows = count_rows(translator.model)
    translator.translate(lines[:200], beam_size=args.beam)  # warm-up
    cases = [("greedy", 1, None)] + [(f"beam {args.beam}, margin {m}", args.beam, m) for m in margins]
    best, outputs, decoded = {}, {}, {}
    for _ in range(args.passes):
        for name, beam, margin in cases:
            translator.config.decoding.prune_margin = margin
            rows[0] = 0
            start = time.perf_counter()
            found = translator.translate(lines, beam_size=beam, alpha=args.alpha)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
            outputs[name], decoded[name] = [hyps[0].text for hyps in found], rows[0]
    full = outputs[cases[1][0]]
    for name, _, _ in cases:
        bleu = score_corpus(outputs[name], refs)["bleu"]  # what nmt evaluate reports
        same = sum(a == b for a, b in zip(outputs[name], full))
        print(f"{name:22s} {len(lines) / best[name]:6.1f} sent/s  x greedy {best[name] / best['greedy']:4.2f}"
              f"  rows {decoded[name]:6d}  BLEU {bleu:.2f}  same as full beam {same}/{len(lines)}")


if __name__ == "__main__":
    run_script(main)
