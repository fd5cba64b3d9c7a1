"""Training-step levers measured side by side in one process (ratios, not absolute speeds).

    python scripts/bench_levers.py configs/transformer.yaml [--steps 6]

Each variant trains a fresh model on the same real batches (Multi30k, the config's token
budget) and reports seconds per optimizer step and its speed-up over the first variant:
torch's label-smoothed cross-entropy vs ours (nmt.loss), float32 vs bf16 autocast, and
(Transformer) dropout on attention weights and inside the feed-forward layer on vs off.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from nmt.config import load_config
from nmt.data.batching import TokenBatchSampler, collate
from nmt.data.module import prepare_data, split_dataset
from nmt.data.tokenizer import PAD
from nmt.loss import smoothed_cross_entropy
from nmt.models import build_model


def torch_loss(logits, target, smoothing):
    return F.cross_entropy(logits.float(), target, ignore_index=PAD, label_smoothing=smoothing)


def our_loss(logits, target, smoothing):
    return smoothed_cross_entropy(logits, target, smoothing, PAD)[0]


def seconds_per_step(model_cfg, vocab, batches, loss_fn, bf16: bool, smoothing: float) -> float:
    torch.manual_seed(0)
    model = build_model(model_cfg, vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
            loss = loss_fn(logits.flatten(0, 1), batch.tgt_out.flatten(), smoothing)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    step(batches[0])  # warm-up
    start = time.perf_counter()
    for batch in batches[1:]:
        step(batch)
    return (time.perf_counter() - start) / (len(batches) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    cfg = load_config(args.config)
    data = prepare_data(cfg.data)
    train = split_dataset(data, "train", cfg.data.max_len)
    sampler = TokenBatchSampler(train.lengths(), cfg.data.max_tokens, shuffle=True, seed=1)
    batches = [collate([train[i] for i in b]) for b in list(sampler)[: args.steps + 1]]
    smoothing = cfg.optim.label_smoothing
    variants = [("torch loss, fp32", cfg.model, torch_loss, False),
                ("our loss, fp32", cfg.model, our_loss, False),
                ("torch loss, bf16", cfg.model, torch_loss, True),
                ("our loss, bf16", cfg.model, our_loss, True)]
    if cfg.model["family"] == "transformer":
        with_dropout = {**cfg.model, "attention_dropout": 0.1, "ff_dropout": 0.1}
        variants += [("our loss, bf16, attn+ff dropout 0.1", with_dropout, our_loss, True)]
    results = {}
    for name, model_cfg, loss_fn, bf16 in variants:
        results[name] = seconds_per_step(model_cfg, len(data.tokenizer), batches, loss_fn, bf16,
                                         smoothing)
        first = next(iter(results.values()))
        print(f"{name:40s} {results[name]:.3f} s/step  {first / results[name]:.2f}x", flush=True)
    print(json.dumps({"bench": "levers", "config": args.config,
                      "sec_per_step": {k: round(v, 4) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
