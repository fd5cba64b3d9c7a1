#!/bin/bash
# Are a training run's steps as fast as the bench's? Alternates `nmt bench train` (43 steps, the
# first 3 untimed) with `nmt train` of the same 43 updates (train_stats.json's tgt_tok_per_s times
# every step, the first 3 included), same config, same hour. Run from the repository root:
#   bash docs/results/amd_epyc_zen3/train_vs_bench_2e86c0d/run.sh OUT_DIR
set -e
OUT=${1:?output folder}
mkdir -p $OUT
export HF_HUB_OFFLINE=1 PATH=$PWD/.venv/bin:$PATH
lscpu | grep -E "Model name|CPU family|^Model:" > $OUT/cpu.txt
for round in 1 2 3; do
  nmt bench train --config configs/transformer.yaml --steps 40 --warmup 3 > $OUT/bench_$round.txt 2>&1
  rm -rf /tmp/train_vs_bench_run
  nmt train --config configs/transformer.yaml --trainer.max_steps 43 --run-dir /tmp/train_vs_bench_run \
      > $OUT/train_$round.log 2>&1
  cp /tmp/train_vs_bench_run/train_stats.json $OUT/train_stats_$round.json
  python3 - $OUT $round <<'PY'
import json, sys
out, r = sys.argv[1], sys.argv[2]
bench = json.loads(open(f"{out}/bench_{r}.txt").read().strip().splitlines()[-1])
train = json.load(open(f"{out}/train_stats_{r}.json"))
print(f"round {r}: bench {bench['tgt_tok_per_s']} tgt tok/s, train {train['tgt_tok_per_s']} "
      f"({train['steps']} updates): train / bench {train['tgt_tok_per_s'] / bench['tgt_tok_per_s']:.3f}")
PY
done | tee $OUT/summary.txt
