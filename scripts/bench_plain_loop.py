"""A plain PyTorch training loop of the same model on the same batches, against ours.

    python scripts/bench_plain_loop.py configs/transformer.yaml configs/rnn_bahdanau.yaml \
        [--steps 20] [--warmup 3] [--rounds 2] [--with-levers] [--stock]

The plain loop is what a user would write with this project's model but none of its levers:
the model built by ``nmt.models.build_model`` from the config, the first batches of the
config's token-budget sampler (epoch 0, the config's seed: those ``nmt bench train`` trains
on), Adam with the config's learning rate and schedule, torch's label-smoothed cross-entropy,
gradient clipping; fp32 eager PyTorch, no autocast, glibc's default allocator. "Ours" is
``nmt bench train`` itself (Lightning, ``precision: auto``, the allocator setting of the
``nmt`` command). Both report target tokens/s over the same timed steps. ``--with-levers``
adds a loop, the plain loop given ours' allocator setting and precision: what is left
between it and ours is what Lightning and our training module cost or save. ``--stock`` adds
the plain loop as a user would write it with PyTorch's building blocks: the same model and
math, but torch's dropout, the fused attention kernel and the additive scorer's tanh where the
model has its own faster implementations (``scripts/stock_pieces.py``).

The allocator setting cannot be undone inside a process, so every measurement runs in a
fresh child process; the rounds alternate plain and ours so that a machine whose load
changes meanwhile slows both alike. The speed-up is the ratio of the median tokens/s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from contextlib import ExitStack

import torch
import torch.nn.functional as F
from stock_pieces import use_stock_pieces

from nmt.cli.options import positive_int, whole_number
from nmt.config import Config, load_config
from nmt.data.batching import Batch, TokenBatchSampler
from nmt.data.module import prepare_data, split_dataset
from nmt.data.tokenizer import PAD
from nmt.errors import run_script
from nmt.models import build_model
from nmt.schedules import inverse_sqrt, warmup_cosine


def first_batches(config: Config, count: int) -> tuple[list[Batch], int]:
    """The first ``count`` training batches of epoch 0, and the vocabulary size."""
    data = prepare_data(config.data)
    train = split_dataset(data, "train", config.data.max_len)
    sampler = TokenBatchSampler(train.lengths(), config.data.max_tokens, shuffle=True,
                                seed=config.seed)
    sampler.set_epoch(0)
    rows = list(sampler)[:count]
    return [train.__getitems__(r) for r in rows], len(data.tokenizer)


def plain_loop(config_path: str, steps: int, warmup: int, levers: bool = False,
               stock: bool = False) -> dict:
    """Target tokens/s of a plain eager training loop (runs in a fresh process): fp32, or
    with ``levers`` the allocator setting and the precision ``auto`` picks; with ``stock``
    PyTorch's dropout and attention kernel, and tanh, for the model's own pieces."""
    with ExitStack() as patches:
        if stock:
            use_stock_pieces(patches)
        tok_per_s, precision = _time_plain_loop(load_config(config_path), steps, warmup, levers)
    name = "plain (stock)" if stock else "plain+levers" if levers else "plain"
    return {"loop": name, "tgt_tok_per_s": tok_per_s, "precision": precision}


def _time_plain_loop(config: Config, steps: int, warmup: int, levers: bool) -> tuple[float, str]:
    """Target tokens/s of the timed steps, and the precision they ran in."""
    precision, dtype = "32-true", None
    if levers:
        from nmt.allocator import keep_freed_memory
        from nmt.precision import autocast_dtype
        from nmt.trainer import training_precision

        keep_freed_memory()
        choice = training_precision(config)
        precision, dtype = choice.precision, autocast_dtype(choice)
    batches, vocab = first_batches(config, warmup + steps)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(config.seed)
    model = build_model(config.model, vocab).to(device).train()
    optim = config.optim
    optimizer = torch.optim.Adam(model.parameters(), lr=optim.lr, betas=tuple(optim.betas),
                                 weight_decay=optim.weight_decay)
    # Per-batch schedules step per batch (cosine over the benchmark's steps); plateau and
    # constant keep the lr within a benchmark.
    schedules = {"inverse_sqrt": inverse_sqrt(optim.warmup_steps),
                 "cosine": warmup_cosine(optim.warmup_steps, lambda step: warmup + steps,
                                         optim.min_lr / optim.lr)}
    schedule = schedules.get(optim.schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule) if schedule else None
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)  # 16-mixed
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    seconds, tokens = 0.0, 0
    for number, batch in enumerate(batches):
        src, tgt_in, tgt_out = (t.to(device) for t in (batch.src, batch.tgt_in, batch.tgt_out))
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(src, src != PAD, tgt_in)  # (B, T, V); the mask is Batch.src_mask
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(),  # fp32 softmax
                               ignore_index=PAD, label_smoothing=optim.label_smoothing)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.trainer.gradient_clip_val)
        scaler.step(optimizer)
        scaler.update()
        if scheduler is not None:
            scheduler.step()
        sync()
        if number >= warmup:
            seconds += time.perf_counter() - start
            tokens += int((tgt_out != PAD).sum())
    return round(tokens / seconds, 1), precision


def ours(config_path: str, steps: int, warmup: int) -> dict:
    """``nmt bench train`` in a fresh process, with the allocator setting ``nmt`` makes."""
    from nmt.allocator import keep_freed_memory
    from nmt.bench import bench_train

    keep_freed_memory()
    summary = bench_train(load_config(config_path), steps, warmup)
    return {"loop": "ours", "tgt_tok_per_s": summary["tgt_tok_per_s"],
            "precision": str(summary["precision"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per measurement")
    parser.add_argument("--warmup", type=whole_number, default=3, help="untimed steps first")
    parser.add_argument("--rounds", type=positive_int, default=2, help="plain/ours pairs per config")
    parser.add_argument("--with-levers", action="store_true",
                        help="also time the plain loop with ours' allocator and precision")
    parser.add_argument("--stock", action="store_true",
                        help="also time the plain loop with PyTorch's stock pieces")
    args = parser.parse_args()
    for path in args.configs:  # a bad one now, not after the others' measurements
        load_config(path)
    loops = {"plain": (plain_loop, ())}  # name: (function, extra arguments), in run order
    if args.stock:
        loops["plain (stock)"] = (plain_loop, (False, True))
    if args.with_levers:
        loops["plain+levers"] = (plain_loop, (True,))
    loops["ours"] = (ours, ())
    summary = []
    context = multiprocessing.get_context("spawn")
    for path in args.configs:
        runs = {name: [] for name in loops}
        for _ in range(args.rounds):
            for name, (loop, extra) in loops.items():
                with context.Pool(1) as pool:  # a fresh process per measurement
                    result = pool.apply(loop, (path, args.steps, args.warmup, *extra))
                print(f"{path} {name}: {result['tgt_tok_per_s']} tgt tok/s "
                      f"({result['precision']})", flush=True)
                runs[name].append(result)
        row = {"config": path}
        for name in loops:
            row[f"{name}_tgt_tok_per_s"] = round(
                statistics.median(r["tgt_tok_per_s"] for r in runs[name]), 1)
        others = [name for name in loops if name != "ours"]
        row["speedup"] = {name: round(row["ours_tgt_tok_per_s"] / row[f"{name}_tgt_tok_per_s"], 2)
                          for name in others}  # ours / each other loop
        row.update(ours_precision=runs["ours"][0]["precision"], rounds=args.rounds,
                   steps=args.steps, threads=torch.get_num_threads())
        summary.append(row)
    print("| config | " + " | ".join(f"{name} tgt tok/s" for name in loops) + " | "
          + " | ".join(f"ours / {name}" for name in others) + " | ours precision |")
    print("|---" * (2 * len(loops) + 1) + "|")
    for row in summary:
        speeds = " | ".join(str(row[f"{name}_tgt_tok_per_s"]) for name in loops)
        ratios = " | ".join(f"{ratio}x" for ratio in row["speedup"].values())
        print(f"| {row['config']} | {speeds} | {ratios} | {row['ours_precision']} |")
    print(json.dumps(summary))


if __name__ == "__main__":
    run_script(main)
