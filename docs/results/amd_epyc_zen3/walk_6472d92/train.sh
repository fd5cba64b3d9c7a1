#!/bin/bash
# Issue 10's time-to-BLEU runs at HEAD, one after another, the default configs and no flags:
# each run's test BLEU (beam 5) and its decoding bench (beam 5 against greedy).
# Run from the repository root: bash docs/results/amd_epyc_zen3/walk_6472d92/train.sh
# (On 2026-11-29 it was stopped at the RNN's first updates: the session had no time left for it.)
set -x
OUT=docs/results/amd_epyc_zen3/walk_6472d92
export HF_HUB_OFFLINE=1 PATH=$PWD/.venv/bin:$PATH
run() {  # name config budget
  nmt train --config configs/$2.yaml --max-time $3 --run-dir checkpoints/$1
  nmt evaluate --checkpoint checkpoints/$1 --beam 5
  mkdir -p $OUT/$1 && cp checkpoints/$1/train_stats.json checkpoints/$1/logs/version_0/metrics.csv \
      $(find checkpoints/$1 -name 'test*' -newer checkpoints/$1/train_stats.json) $OUT/$1/
}
run transformer_15min transformer 00:15:00
nmt bench decode --checkpoint checkpoints/transformer_15min --precision auto --beam 1,5 2>&1 | tee $OUT/bench_decode_transformer_15min.txt
run rnn_30min rnn_bahdanau 00:30:00
nmt bench decode --checkpoint checkpoints/rnn_30min --precision auto --beam 1,5 2>&1 | tee $OUT/bench_decode_rnn_30min.txt
