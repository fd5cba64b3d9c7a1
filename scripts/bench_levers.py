"""Training-step levers measured side by side in one process (ratios, not absolute speeds).

    python scripts/bench_levers.py configs/transformer.yaml [--steps 14] [--rounds 3]

Every variant trains a fresh model on the same real batches (Multi30k, the config's token
budget). The reference is the shipped setup: glibc malloc keeping freed memory
(nmt.allocator), the precision `trainer.precision: auto` chooses on this machine (bf16
autocast or fp32), dropout masks drawn by nmt.dropout, the blockwise label-smoothed
cross-entropy of nmt.loss, Adam's fused kernel and, for the Transformer, the explicit attention path
at sentence lengths with no dropout on attention weights or inside the feed-forward layer;
for the additive scorer, its sigmoid form (nmt.attention.AdditiveScorer); for the RNN, its
annotations cast once to autocast's dtype (nmt.models.autocast.in_autocast_dtype).
Each other variant turns one lever off (for precision: takes the other one); its speed-up is
its seconds per step over the reference's, medians over rounds in which every variant runs once
in turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

import torch
import torch.nn.functional as F
from stock_pieces import use_stock_pieces

import nmt.models.rnn
from nmt.allocator import keep_freed_memory
from nmt.cli.options import positive_int
from nmt.config import Config, load_config
from nmt.data.batching import Batch, TokenBatchSampler, collate
from nmt.data.module import PreparedData, prepare_data, split_dataset
from nmt.data.tokenizer import PAD
from nmt.errors import run_script
from nmt.loss import smoothed_cross_entropy
from nmt.models import build_model
from nmt.trainer import training_precision


@dataclass
class Variant:
    name: str
    model_overrides: dict
    other_precision: bool = False  # the precision auto did not choose (bf16 autocast or fp32)
    fused_attention_everywhere: bool = False
    torch_dropout: bool = False  # torch's dropout (bernoulli_ masks) instead of nmt.dropout's
    torch_loss: bool = False  # F.cross_entropy on an fp32 copy instead of nmt.loss's
    tanh_additive: bool = False  # v^T tanh(W q + U k) as written, instead of its sigmoid form
    unfused_adam: bool = False  # Adam's loop of per-tensor operators instead of its fused kernel
    cast_per_step: bool = False  # the RNN's annotations cast at every decoder step, not once


def seconds_per_step(variant: Variant, auto_bf16: bool, model_cfg: dict, vocab: int, batches,
                     smoothing) -> float:
    bf16 = auto_bf16 != variant.other_precision
    torch.manual_seed(0)
    model = build_model({**model_cfg, **variant.model_overrides}, vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=not variant.unfused_adam)

    def step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(batch.src, batch.src_mask, batch.tgt_in)
            if variant.torch_loss:
                loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                                       ignore_index=PAD, label_smoothing=smoothing)
            else:
                loss = smoothed_cross_entropy(logits.flatten(0, 1), batch.tgt_out.flatten(),
                                              smoothing, PAD)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    with ExitStack() as patches:
        use_stock_pieces(patches, variant.torch_dropout, variant.fused_attention_everywhere,
                         variant.tanh_additive)
        if variant.cast_per_step:
            patches.enter_context(mock.patch.object(nmt.models.rnn, "in_autocast_dtype", lambda x: x))
        step(batches[0])  # warm-up
        start = time.perf_counter()
        for batch in batches[1:]:
            step(batch)
        return (time.perf_counter() - start) / (len(batches) - 1)


def real_batches(cfg: Config, count: int) -> tuple[PreparedData, list[Batch]]:
    """The corpus, and its first ``count`` training batches at the config's token budget."""
    data = prepare_data(cfg.data)
    train = split_dataset(data, "train", cfg.data.max_len)
    sampler = TokenBatchSampler(train.lengths(), cfg.data.max_tokens, shuffle=True, seed=1)
    return data, [collate([train[i] for i in b]) for b in list(sampler)[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("config")
    parser.add_argument("--steps", type=positive_int, default=14)
    parser.add_argument("--rounds", type=positive_int, default=3, help="passes per variant, in turn; "
                        "the median counts (the allocator's is one pass, before the others)")
    args = parser.parse_args()
    cfg = load_config(args.config)
    data, batches = real_batches(cfg, args.steps + 1)
    bf16 = training_precision(cfg).precision == "bf16-mixed"  # auto's choice, printed
    reference = Variant("shipped setup (reference)", {})
    off = [Variant("fp32 (no bf16 autocast)" if bf16 else "bf16 autocast", {}, other_precision=True),
           Variant("torch's dropout masks (bernoulli_)", {}, torch_dropout=True),
           Variant("torch's cross-entropy on an fp32 copy", {}, torch_loss=True),
           Variant("Adam unfused (a loop of per-tensor ops)", {}, unfused_adam=True)]
    if cfg.model["family"] == "transformer":
        off += [Variant("fused SDPA at every length", {}, fused_attention_everywhere=True),
                Variant("attn+ff dropout 0.1", {"attention_dropout": 0.1, "ff_dropout": 0.1})]
    if cfg.model["family"] == "rnn" and bf16:
        off += [Variant("RNN annotations cast at every step", {}, cast_per_step=True)]
    if cfg.model["attention"] == "additive":
        off += [Variant("tanh in the additive scorer (as written)", {}, tanh_additive=True)]

    def measure(variant: Variant) -> float:
        return seconds_per_step(variant, bf16, cfg.model, len(data.tokenizer), batches,
                                cfg.optim.label_smoothing)

    # The allocator is process-wide and cannot be switched back: measure it off first, once.
    allocator_off = "glibc malloc default (mmap per big tensor)"
    passes = {allocator_off: [measure(reference)]}
    keep_freed_memory()
    # The rest in rounds, every variant once per round in turn: a single pass per variant in a
    # fixed order misread fused Adam as a loss of 5% on a Zen 5 EPYC, where it saves 9 ms a step.
    for _ in range(args.rounds):
        for variant in [reference, *off]:
            passes.setdefault(variant.name, []).append(measure(variant))
    results = {name: statistics.median(seconds) for name, seconds in passes.items()}
    ref = results[reference.name]
    print(f"{'variant':45s} {'s/step':>7s}  lever's speed-up")
    for name, sec in results.items():
        print(f"{name:45s} {sec:7.3f}  {'-' if name == reference.name else f'{sec / ref:.2f}x'}")
    print(json.dumps({"bench": "levers", "config": args.config, "rounds": args.rounds,
                      "sec_per_step": {k: round(v, 4) for k, v in results.items()}}))


if __name__ == "__main__":
    run_script(main)
