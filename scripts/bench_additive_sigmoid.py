"""What does computing the additive scorer through sigmoid buy? The shipped
``AdditiveScorer.score`` (e = 2 v^T sigmoid(2 (W q + U k)) - sum(v)) against the textbook
e = v^T tanh(W q + U k), side by side in one process, on a trained RNN run.

    python scripts/bench_additive_sigmoid.py RUN [--passes 3] [--train-steps 8]
        [--precision 32-true] [--split test] [--alpha A]

Decoding: greedy and beam search over the split with each formula, alternating, fastest of
``--passes``; BLEU and how many outputs are the same. Training: seconds per step of a fresh
model of the run's config on the same real batches, each formula in turn, best of 3 rounds,
and the losses of the first round (the same to rounding if the formulas agree).
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from nmt.allocator import keep_freed_memory
from nmt.attention import AdditiveScorer
from nmt.data.batching import TokenBatchSampler, collate
from nmt.data.corpus import load_corpus
from nmt.data.module import prepare_data, split_dataset
from nmt.data.tokenizer import PAD
from nmt.loss import smoothed_cross_entropy
from nmt.metrics import score_corpus
from nmt.models import build_model
from nmt.translator import Translator


def tanh_score(self: AdditiveScorer, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Bahdanau's formula as written: v^T tanh(W q + U k)."""
    q = self.query_proj(query).unsqueeze(-2)  # (..., T, 1, A)
    return self.v(torch.tanh(q + keys.unsqueeze(-3))).squeeze(-1)  # (..., T, S)


FORMULAS = {"tanh": tanh_score, "sigmoid (shipped)": AdditiveScorer.score}


def bench_decoding(translator: Translator, lines: list[str], refs: list[str], passes: int,
                   alpha: float | None) -> None:
    best, outputs = {}, {}
    for _ in range(passes):
        for beam in (1, translator.config.decoding.beam_size):
            for name, score in FORMULAS.items():
                with mock.patch.object(AdditiveScorer, "score", score):
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


def bench_training(translator: Translator, steps: int) -> None:
    cfg = translator.config
    data = prepare_data(cfg.data)
    train = split_dataset(data, "train", cfg.data.max_len)
    sampler = TokenBatchSampler(train.lengths(), cfg.data.max_tokens, shuffle=True, seed=1)
    batches = [collate([train[i] for i in b]) for b in list(sampler)[: steps + 1]]

    def seconds_per_step(score) -> tuple[float, list[float]]:
        torch.manual_seed(0)
        model = build_model(cfg.model, len(data.tokenizer))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses = []
        with mock.patch.object(AdditiveScorer, "score", score):
            for i, batch in enumerate(batches):
                if i == 1:  # the first step is a warm-up
                    start = time.perf_counter()
                logits = model(batch.src, batch.src_mask, batch.tgt_in)
                loss = smoothed_cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),
                                              cfg.optim.label_smoothing, PAD)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(round(loss.item(), 4))
        return (time.perf_counter() - start) / steps, losses

    rounds = {name: [seconds_per_step(score) for _ in range(3)] for name, score in FORMULAS.items()}
    for name, results in rounds.items():
        fastest = min(sec for sec, _ in results)
        print(f"training, {name:18s} {fastest:.3f} s/step (rounds: "
              f"{', '.join(f'{sec:.3f}' for sec, _ in results)}); losses {results[0][1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run directory of an RNN with additive attention")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=8)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--split", default="test")
    parser.add_argument("--alpha", type=float, default=None, help="length penalty (default: the run's)")
    args = parser.parse_args()
    keep_freed_memory()  # as the nmt command does
    translator = Translator.from_run_dir(args.run, precision=args.precision)
    corpus = load_corpus(translator.config.data)[args.split]
    bench_decoding(translator, list(corpus["src"]), list(corpus["tgt"]), args.passes, args.alpha)
    bench_training(translator, args.train_steps)


if __name__ == "__main__":
    main()
