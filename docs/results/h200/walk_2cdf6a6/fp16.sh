#!/bin/bash
# Second call on the same warm H200 (2026-11-30): the 16-mixed path (gradient scaler), which auto
# takes on GPUs older than compute 8.0, in the bench and in decoding, beside bf16 and fp32.
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ -d /tmp/site/litserve ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site gpu_carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD; NMT="python3 -m nmt"
ls checkpoints
{ for cfg in transformer rnn_bahdanau; do
    echo "== nmt bench train --config configs/$cfg.yaml --steps 40 --warmup 5 --trainer.precision 16-mixed"
    timeout 60 $NMT bench train --config configs/$cfg.yaml --steps 40 --warmup 5 --trainer.precision 16-mixed 2>&1 | grep -E "^\||rror|precision"
  done
  for run in checkpoints/g_transformer_de-en checkpoints/g_rnn_bahdanau_de-en; do
    echo "== nmt bench decode --checkpoint $run --beam 1,5 --precision bf16-mixed,16-mixed,32-true --no-recompute"
    timeout 90 $NMT bench decode --checkpoint $run --beam 1,5 --precision bf16-mixed,16-mixed,32-true --no-recompute 2>&1 | grep -E "^\||rror"
  done
} 2>&1 | tee "$OUT/fp16.txt"
