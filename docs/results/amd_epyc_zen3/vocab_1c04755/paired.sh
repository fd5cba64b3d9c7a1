#!/bin/bash
# The same comparison with both vocabularies training at the same time, each pinned to its own
# core with one thread, so that both see the same hour of the host: --max-time 00:22:00 at one
# thread makes about the updates 15 minutes make at two (1,450-1,650 against ~1,000 tgt tok/s).
# Run from the repository root: bash docs/results/amd_epyc_zen3/vocab_1c04755/paired.sh
set -x
OUT=docs/results/amd_epyc_zen3/vocab_1c04755
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PATH=$PWD/.venv/bin:$PATH
one() {  # core vocabulary
  name=p$2
  taskset -c $1 nmt train --config configs/transformer.yaml --max-time 00:22:00 \
      --run-dir checkpoints/vocab_$name --data.vocab_size $2 --trainer.enable_progress_bar false
  for split in val test; do
    taskset -c $1 nmt evaluate --checkpoint checkpoints/vocab_$name --split $split --beam 5
  done
  mkdir -p $OUT/$name && cp checkpoints/vocab_$name/train_stats.json \
      checkpoints/vocab_$name/logs/version_0/metrics.csv checkpoints/vocab_$name/eval/*.json $OUT/$name/
}
one 0 8000 > /tmp/vocab_p8000.log 2>&1 &
one 1 4000 > /tmp/vocab_p4000.log 2>&1
wait
