"""Where does a training step's time go? torch.profiler over the shipped step of a config.

    python scripts/profile_train.py configs/transformer.yaml [--steps 6] [--rows 18]

Trains as scripts/bench_levers.py's reference does (the precision `auto` chooses, the
allocator, fused Adam, real Multi30k batches), once unprofiled to warm up, then once profiled.
Prints the operators by self CPU time and the matmuls' share of it: what is left for the
elementwise work, which eager PyTorch runs one operator at a time, is where the MFU is lost.
"""

from __future__ import annotations

import argparse

from bench_levers import Variant, real_batches, seconds_per_step
from torch.profiler import ProfilerActivity, profile

from nmt.allocator import keep_freed_memory
from nmt.cli.options import positive_int
from nmt.config import load_config
from nmt.errors import run_script
from nmt.trainer import training_precision

MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # the first paragraph
    parser.add_argument("config")
    parser.add_argument("--steps", type=positive_int, default=6, help="profiled steps (plus a warm-up)")
    parser.add_argument("--rows", type=positive_int, default=18, help="operators shown")
    args = parser.parse_args()
    cfg = load_config(args.config)
    data, batches = real_batches(cfg, args.steps + 1)
    bf16 = training_precision(cfg).precision == "bf16-mixed"  # auto's choice, printed
    keep_freed_memory()  # as the nmt command does

    def step_seconds() -> float:
        return seconds_per_step(Variant("shipped setup", {}), bf16, cfg.model,
                                len(data.tokenizer), batches, cfg.optim.label_smoothing)

    print(f"unprofiled: {step_seconds():.3f} s/step")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step_seconds()
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    print(f"matmuls ({', '.join(sorted(MATMULS))}): {matmul / total:.0%} of self CPU time")


if __name__ == "__main__":
    run_script(main)
