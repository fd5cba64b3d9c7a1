#!/bin/bash
# The same comparison with both vocabularies training at the same time, each pinned to its own
# core with one thread, so that both see the same hour of the host: --max-time 00:22:00 at one
# thread makes about the updates 15 minutes make at two (1,450-1,650 against ~1,000 tgt tok/s).
# Run from the repository root: bash docs/results/amd_epyc_zen3/vocab_1c04755/paired.sh [CONFIG]
# with CONFIG transformer (the default: runs p8000 and p4000) or rnn_bahdanau (rnn_p8000, rnn_p4000).
set -x
OUT=docs/results/amd_epyc_zen3/vocab_1c04755
CONFIG=${1:-transformer}
PREFIX=$([ $CONFIG = transformer ] || echo rnn_)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PATH=$PWD/.venv/bin:$PATH
one() {  # core vocabulary
  name=${PREFIX}p$2
  taskset -c $1 nmt train --config configs/$CONFIG.yaml --max-time 00:22:00 \
      --run-dir checkpoints/vocab_$name --data.vocab_size $2 --trainer.enable_progress_bar false
  for split in val test; do
    taskset -c $1 nmt evaluate --checkpoint checkpoints/vocab_$name --split $split --beam 5
  done
  mkdir -p $OUT/$name && cp checkpoints/vocab_$name/train_stats.json \
      checkpoints/vocab_$name/logs/version_0/metrics.csv checkpoints/vocab_$name/eval/* $OUT/$name/
}
one 0 8000 > /tmp/vocab_${PREFIX}p8000.log 2>&1 &
one 1 4000 > /tmp/vocab_${PREFIX}p4000.log 2>&1
wait
