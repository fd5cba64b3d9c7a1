#!/bin/bash
# Issue 10's benches at HEAD on a 2-core AMD EPYC without AVX-512 (Zen 3), alone on the machine.
# Run from the repository root: bash docs/results/amd_epyc_zen3/walk_6472d92/bench.sh
set -x
OUT=docs/results/amd_epyc_zen3/walk_6472d92
export HF_HUB_OFFLINE=1 PATH=$PWD/.venv/bin:$PATH
lscpu | grep -E "Model name|CPU family|^Model:"
nmt prepare --config configs/transformer.yaml
for cfg in transformer rnn_bahdanau; do
  nmt bench train --config configs/$cfg.yaml --steps 30 --warmup 3 2>&1 | tee $OUT/bench_train_$cfg.txt
done
python scripts/bench_plain_loop.py configs/transformer.yaml configs/rnn_bahdanau.yaml \
    --steps 20 --warmup 3 --rounds 3 --stock 2>&1 | tee $OUT/plain_loop.txt
