"""test_bench_attention_keeps_the_rows_that_fit_in_memory's bench, its rows printed."""
import json
import sys

import torch

from nmt import bench_attention
from nmt.attention import SCORERS

if __name__ == "__main__":
    bench_attention.SCORERS = {name: SCORERS[name] for name in ("additive", "dot")}
    summary = bench_attention.bench_attention(max_len=256, memory_limit_mb=40)
    print(sys.argv[1:], "threads", torch.get_num_threads(), json.dumps(summary["rows"]))
