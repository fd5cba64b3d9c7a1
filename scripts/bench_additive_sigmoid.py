"""What does computing the additive scorer through sigmoid buy? The shipped
``AdditiveScorer.score`` (e = 2 v^T sigmoid(2 (W q + U k)) - sum(v)) against the textbook
e = v^T tanh(W q + U k), side by side in one process, on a trained RNN run.

    python scripts/bench_additive_sigmoid.py RUN [--passes 3] [--precision 32-true]
        [--split test] [--alpha A]

Decoding: greedy and beam search over the split with each formula, alternating, fastest of
``--passes``; BLEU and how many outputs are the same. The training step's side is the
"tanh in the additive scorer" lever of ``scripts/bench_levers.py configs/rnn_bahdanau.yaml``.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from nmt.allocator import keep_freed_memory
from nmt.attention import AdditiveScorer
from nmt.data.corpus import load_corpus
from nmt.errors import run_script
from nmt.metrics import score_corpus
from nmt.translator import Translator


def plain_keys(self: AdditiveScorer, keys: torch.Tensor) -> torch.Tensor:
    """U k, as written (the shipped ``prepare_keys`` returns 2 U k for its sigmoid form)."""
    return self.key_proj(keys)  # (..., S, A)


def tanh_score(self: AdditiveScorer, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Bahdanau's formula as written: v^T tanh(W q + U k), from keys prepared by ``plain_keys``."""
    q = self.query_proj(query).unsqueeze(-2)  # (..., T, 1, A)
    return self.v(torch.tanh(q + keys.unsqueeze(-3))).squeeze(-1)  # (..., T, S)


# Each formula: the AdditiveScorer methods it takes, swapped in together.
TANH = {"prepare_keys": plain_keys, "score": tanh_score}
FORMULAS = {"tanh": TANH, "sigmoid (shipped)": {"prepare_keys": AdditiveScorer.prepare_keys,
                                                "score": AdditiveScorer.score}}


def bench_decoding(translator: Translator, lines: list[str], refs: list[str], passes: int,
                   alpha: float | None) -> None:
    best, outputs = {}, {}
    for _ in range(passes):
        for beam in (1, translator.config.decoding.beam_size):
            for name, methods in FORMULAS.items():
                with mock.patch.multiple(AdditiveScorer, **methods):
                    start = time.perf_counter()
                    found = translator.translate(lines, beam_size=beam, alpha=alpha)
                    seconds = time.perf_counter() - start
                best[beam, name] = min(best.get((beam, name), float("inf")), seconds)
                outputs[beam, name] = [hyps[0].text for hyps in found]
    for (beam, name), seconds in best.items():
        same = sum(a == b for a, b in zip(outputs[beam, name], outputs[beam, "tanh"]))
        bleu = score_corpus(outputs[beam, name], refs)["bleu"]
        print(f"beam {beam}, {name:18s} {len(lines) / seconds:6.1f} sent/s  "
              f"{best[beam, 'tanh'] / seconds:4.2f}x tanh's  BLEU {bleu:.2f}  "
              f"same as tanh's {same}/{len(lines)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("run", help="run directory of an RNN with additive attention")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--split", default="test")
    parser.add_argument("--alpha", type=float, default=None, help="length penalty (default: the run's)")
    args = parser.parse_args()
    keep_freed_memory()  # as the nmt command does
    translator = Translator.from_run_dir(args.run, precision=args.precision)
    corpus = load_corpus(translator.config.data)[args.split]
    bench_decoding(translator, list(corpus["src"]), list(corpus["tgt"]), args.passes, args.alpha)


if __name__ == "__main__":
    run_script(main)
