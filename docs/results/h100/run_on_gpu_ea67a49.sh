#!/bin/bash
# Issue 10 GPU row, as run on the lent H100 (2026-11-27), one call: bash gpu_carry/gpu.sh
# gpu_carry/ held the Multi30k files and wheels of datasets, dill, multiprocess, omegaconf and
# antlr4 (missing from the GPU image); a user with the project installed needs only the nmt commands.
# Locally (a dry run on CPU): LOCAL=1 PY=.venv/bin/python OUT=/tmp/gpu_out STEPS=2 WARM=1 BUDGET=00:00:20 bash gpu_carry/gpu.sh
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [ -z "$LOCAL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site gpu_carry/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  mkdir -p data; rm -rf data/multi30k; cp -r gpu_carry/multi30k data/multi30k
fi
NMT="$PY -m nmt"
STEPS=${STEPS:-60}; WARM=${WARM:-10}; BUDGET=${BUDGET:-00:10:00}; GUARD=${GUARD:-320}
CFGS=${CFGS:-"transformer rnn_bahdanau"}
PAIRS=${PAIRS:-"de-en en-de"}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  nproc; lscpu | grep 'Model name'
  $PY -c "import torch, lightning, pyarrow, datasets, sacrebleu, sentencepiece as s; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'pyarrow', pyarrow.__version__, 'datasets', datasets.__version__, 'sacrebleu', sacrebleu.__version__, 'spm', s.__version__)"
  git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | head
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Training speed, each config alone on the machine.
for cfg in $CFGS; do
  echo "== nmt bench train --config configs/$cfg.yaml --steps $STEPS --warmup $WARM"
  timeout 120 $NMT bench train --config configs/$cfg.yaml --steps $STEPS --warmup $WARM; echo "exit $?"
done > "$OUT/bench_train.txt" 2>&1
cat "$OUT/bench_train.txt"

# 2. The 10-minute trainings, all at once: each is bound by kernel launches and Python, not by
#    the GPU (MFU < 1%); on the H200, two shared runs made the same updates as each alone.
for cfg in $CFGS; do
  for pair in $PAIRS; do
    src=${pair%-*}; tgt=${pair#*-}; run=checkpoints/gpu_${cfg}_$pair
    ( echo "== nmt train --config configs/$cfg.yaml --src-lang $src --tgt-lang $tgt --max-time $BUDGET --run-dir $run; start $(date -u)"
      timeout "$GUARD" $NMT train --config configs/$cfg.yaml --src-lang $src --tgt-lang $tgt \
          --max-time "$BUDGET" --run-dir $run
      echo "exit $? at $(date -u)" ) > "$OUT/train_${cfg}_$pair.log" 2>&1 &
  done
done
wait

# 3. Test BLEU (beam 5) with the weights each run chose, and with best.ckpt.
for cfg in $CFGS; do
  for pair in $PAIRS; do
    run=checkpoints/gpu_${cfg}_$pair
    ( echo "== nmt evaluate --checkpoint $run"; timeout 60 $NMT evaluate --checkpoint $run
      echo "== nmt evaluate --checkpoint $run --weights best.ckpt"
      timeout 60 $NMT evaluate --checkpoint $run --weights best.ckpt ) >> "$OUT/train_${cfg}_$pair.log" 2>&1 &
  done
done
wait
echo "== nmt bench decode --checkpoint checkpoints/gpu_transformer_de-en --beam 1,5 --repeat 3" > "$OUT/bench_decode.txt"
timeout 60 $NMT bench decode --checkpoint checkpoints/gpu_transformer_de-en --beam 1,5 --repeat 3 >> "$OUT/bench_decode.txt" 2>&1
tar czf "$OUT/runs.tar.gz" --exclude='*.ckpt' checkpoints/gpu_*
tail -n 4 "$OUT"/train_*.log "$OUT/bench_decode.txt"
