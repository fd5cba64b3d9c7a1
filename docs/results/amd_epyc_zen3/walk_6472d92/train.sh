#!/bin/bash
# Issue 10's time-to-BLEU runs at HEAD, one after another, the default configs and no flags:
# each run's test BLEU (beam 5) and its decoding bench (beam 5 against greedy).
# Run from the repository root: bash docs/results/amd_epyc_zen3/walk_6472d92/train.sh [STEP...]
# with STEP among transformer_15min rnn_30min transformer_30min (default: all, in that order).
# On 2026-11-29 the first session ran transformer_15min and was stopped at the RNN's first updates
# (no time left); the next session, at d5724a1 (no change to training or decoding since 6472d92),
# ran rnn_30min and transformer_30min on the same kind of host.
set -x
OUT=docs/results/amd_epyc_zen3/walk_6472d92
export HF_HUB_OFFLINE=1 PATH=$PWD/.venv/bin:$PATH
run() {  # name config budget
  nmt train --config configs/$2.yaml --max-time $3 --run-dir checkpoints/$1
  nmt evaluate --checkpoint checkpoints/$1 --beam 5
  mkdir -p $OUT/$1 && cp checkpoints/$1/train_stats.json checkpoints/$1/logs/version_0/metrics.csv \
      $(find checkpoints/$1 -name 'test*' -newer checkpoints/$1/train_stats.json) $OUT/$1/
}
step() {  # name config budget: train, evaluate, then the decoding bench
  run $1 $2 $3
  nmt bench decode --checkpoint checkpoints/$1 --precision auto --beam 1,5 2>&1 | tee $OUT/bench_decode_$1.txt
}
for s in ${@:-transformer_15min rnn_30min transformer_30min}; do
  case $s in
    transformer_15min) step transformer_15min transformer 00:15:00 ;;
    rnn_30min) step rnn_30min rnn_bahdanau 00:30:00 ;;
    transformer_30min) step transformer_30min transformer 00:30:00 ;;
    *) echo "unknown step: $s" >&2; exit 2 ;;
  esac
done
