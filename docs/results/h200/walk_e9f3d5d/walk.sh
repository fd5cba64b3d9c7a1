#!/bin/bash
# Ran from gpu_carry/ (the Multi30k files and the wheels the image lacks: datasets, dill, multiprocess,
# omegaconf, litserve, fastapi, starlette, uvicorn, pydantic(-core), annotated-types, typing-inspection,
# pyzmq, opentelemetry-api), carried to the lent H200 (2026-11-28): bash gpu_carry/walk.sh
# GPU walk-through at HEAD (one call): each bench alone, the suite (CUDA hidden, as CI) beside
# 2-minute trainings of both configs, then the decoding commands on those runs (--alignment in
# auto's precision and fp32), fused attention's fully masked rows, serve, bench decode.
# Dry run: LOCAL=1 PY=.venv/bin/python OUT=/tmp/gw STEPS=2 BUDGET=00:00:20 PYTEST_S=5 bash gpu_carry/walk.sh
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NMT_CACHE_DIR=/tmp/nmt_cache
if [ -z "$LOCAL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site gpu_carry/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  mkdir -p data; rm -rf data/multi30k; cp -r gpu_carry/multi30k data/multi30k
fi
NMT="$PY -m nmt"
STEPS=${STEPS:-40}; BUDGET=${BUDGET:-00:02:00}; PYTEST_S=${PYTEST_S:-230}
T0=$(date +%s); stamp() { echo "[t+$(( $(date +%s) - T0 )) s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  nproc; lscpu | grep 'Model name'
  $PY -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)"
  $NMT --version
  git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | head
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Training speed, each config alone (quiet machine).
for cfg in transformer rnn_bahdanau; do
  stamp "nmt bench train --config configs/$cfg.yaml --steps $STEPS --warmup 5"
  timeout 90 $NMT bench train --config configs/$cfg.yaml --steps "$STEPS" --warmup 5 2>&1 | grep -vE "^\s*$"
  echo "exit ${PIPESTATUS[0]}"
done > "$OUT/bench_train.txt" 2>&1
cat "$OUT/bench_train.txt"

# 2. The suite (CUDA hidden by tests/conftest.py, as in CI; -v names each failure as it happens)
#    beside two short trainings of the defaults.
if [ -z "$LOCAL" ]; then
  ( timeout "$PYTEST_S" $PY -m pytest -v -n 12 --dist loadfile -p no:cacheprovider tests \
      --ignore=tests/test_export.py > "$OUT/pytest.txt" 2>&1; echo "pytest exit $?" >> "$OUT/pytest.txt" ) &
  PT=$!
fi
for cfg in transformer rnn_bahdanau; do
  ( echo "== nmt train --config configs/$cfg.yaml --max-time $BUDGET --run-dir checkpoints/g_$cfg"
    timeout 200 $NMT train --config configs/$cfg.yaml --max-time "$BUDGET" --run-dir checkpoints/g_$cfg \
        --trainer.enable_progress_bar false 2>&1 | grep -vE "^\s*\||^---|Params|params|Modules|Total"
    echo "exit ${PIPESTATUS[0]} at $(date -u)" ) > "$OUT/train_$cfg.log" 2>&1 &
done
wait $(jobs -p | grep -v "^${PT:-x}$")
stamp "trainings done" >> "$OUT/decode.txt"
T=checkpoints/g_transformer; R=checkpoints/g_rnn_bahdanau
S='Ein Hund läuft durch den Schnee.\nZwei Männer spielen Fußball auf einer grünen Wiese.\nEine Frau mit einem roten Hut liest ein Buch.\n'
# 3. Decoding on those runs.
{
  for run in $T $R; do echo "== evaluate $run"; timeout 60 $NMT evaluate --checkpoint $run; echo "exit $?"; done
  for run in $T $R; do for p in "" "--precision 32-true"; do
    echo "== translate --checkpoint $run --alignment $p"
    printf "$S" | timeout 60 $NMT translate --checkpoint $run --alignment $p; echo "exit $?"
  done; done
  echo "== masked rows"; timeout 60 $PY gpu_carry/masked_rows.py
  echo "== serve"; s=$(date +%s%N)
  timeout 100 $NMT serve --checkpoint $T $R --port 8000 > "$OUT/serve.log" 2>&1 & SV=$!
  for _ in $(seq 600); do curl -sf -m 1 localhost:8000/health > /dev/null && break; sleep 0.1; done
  echo "healthy (or gave up) after $(( ($(date +%s%N) - s) / 1000000 )) ms"
  curl -s -m 30 localhost:8000/translate -H 'Content-Type: application/json' \
     -d '{"text": ["Ein Hund läuft durch den Schnee.", "Zwei Männer spielen Fußball."], "beam": 5, "model": "g_rnn_bahdanau"}'
  echo; kill -TERM $SV; sleep 3; kill -KILL $SV 2>/dev/null; echo "serve stopped"
  stamp "bench decode"
  timeout 70 $NMT bench decode --checkpoint $T --beam 1,5 --repeat 2 2>&1 | grep -vE "^\s*$"
  stamp "end"
} >> "$OUT/decode.txt" 2>&1
tar czf "$OUT/runs.tar.gz" --exclude='*.ckpt' $T $R
tail -n 8 "$OUT"/train_*.log; cat "$OUT/decode.txt"
[ -n "$PT" ] && { wait $PT; grep -E "FAILED|ERROR|passed|failed|pytest exit" "$OUT/pytest.txt" | tail -n 30; }
stamp "all done"
