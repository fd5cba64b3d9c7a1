#!/bin/bash
# Issue 10 GPU row, as run on the lent H200 (2026-11-26): bash run_on_gpu.sh bench, then train.
# gpu_carry/ held the Multi30k files and wheels of datasets, dill, multiprocess and omegaconf
# (missing from the GPU image); a user with the project installed needs only the nmt commands.
# Locally (a dry run on CPU): LOCAL=1 PY=.venv/bin/python OUT=/tmp/gpu_out STEPS=2 WARM=1 BUDGET=00:00:40 bash gpu_carry/gpu.sh train
mode=$1
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -z "$LOCAL" ]; then
  [ -d /tmp/site/datasets ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site gpu_carry/whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  if [ ! -f data/multi30k/train.de.gz ]; then rm -rf data/multi30k; cp -r gpu_carry/multi30k data/multi30k; fi
fi
NMT="$PY -m nmt"
STEPS=${STEPS:-60}; WARM=${WARM:-10}; BUDGET=${BUDGET:-00:10:00}; GUARD=${GUARD:-400}
CFGS="transformer rnn_bahdanau"
case $mode in
bench)
  { date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    nproc
    $PY -c "import torch, lightning, pyarrow, datasets, sacrebleu, sentencepiece as s; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'pyarrow', pyarrow.__version__, 'datasets', datasets.__version__, 'sacrebleu', sacrebleu.__version__, 'spm', s.__version__)"
    git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | head
  } > "$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
  for cfg in $CFGS; do
    echo "== nmt bench train --config configs/$cfg.yaml --steps $STEPS --warmup $WARM"
    timeout 150 $NMT bench train --config configs/$cfg.yaml --steps $STEPS --warmup $WARM; echo "exit $?"
  done 2>&1 | tee "$OUT/bench.txt"
  ;;
train)
  # Both trainings at once: each is bound by kernel launches and Python, not by the GPU (MFU < 1%).
  for cfg in $CFGS; do
    ( echo "== nmt train --config configs/$cfg.yaml --max-time $BUDGET --run-dir checkpoints/gpu_$cfg; start $(date -u)"
      timeout "$GUARD" $NMT train --config configs/$cfg.yaml --max-time "$BUDGET" --run-dir checkpoints/gpu_$cfg
      echo "exit $? at $(date -u)" ) > "$OUT/train_$cfg.log" 2>&1 &
  done
  wait
  for cfg in $CFGS; do
    run=checkpoints/gpu_$cfg
    ( timeout 60 $NMT average --checkpoint $run --last 5
      for w in best.ckpt averaged.ckpt; do
        for split in test val; do
          echo "== nmt evaluate --checkpoint $run --weights $w --split $split"
          timeout 60 $NMT evaluate --checkpoint $run --weights $w --split $split
        done
      done ) > "$OUT/eval_$cfg.log" 2>&1 &
  done
  wait
  echo "== nmt bench decode --checkpoint checkpoints/gpu_transformer --beam 1,5" > "$OUT/decode.txt"
  timeout 90 $NMT bench decode --checkpoint checkpoints/gpu_transformer --beam 1,5 >> "$OUT/decode.txt" 2>&1
  tar czf "$OUT/runs.tar.gz" --exclude='*.ckpt' checkpoints/gpu_transformer checkpoints/gpu_rnn_bahdanau
  tail -n 5 "$OUT"/*.log "$OUT/decode.txt"
  ;;
esac

# Then each training again alone, one after the other (the *_alone_* folders), on the same warm machine:
# for c in transformer rnn_bahdanau; do
#   timeout 190 python3 -m nmt train --config configs/$c.yaml --max-time 00:10:00 --run-dir checkpoints/solo_$c
#   timeout 30 python3 -m nmt evaluate --checkpoint checkpoints/solo_$c
# done
