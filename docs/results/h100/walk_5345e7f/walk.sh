#!/bin/bash
# As run on the lent H100 (2026-11-27), from the repository root, with gpu_carry/ carried: the
# Multi30k files, wheels of what the GPU image lacks (datasets, dill, multiprocess, omegaconf
# 2.3, antlr4, litserve and its needs), and for diag.sh py-spy and a 5-step run (gpu_carry/tiny).
# A GPU walk-through at HEAD, one call on the lent H100: bench train (quiet), then the test suite
# (pytest -n 8) beside two short trainings, then the README's decoding commands on their runs:
# evaluate, translate (stdin, n-best, auto precision), average, ensemble, serve + a request,
# bench decode.  Dry run here: LOCAL=1 PY=.venv/bin/python OUT=/tmp/gw STEPS=2 BUDGET=00:00:20 bash gpu_carry/walk.sh
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
STEPS=${STEPS:-40}; BUDGET=${BUDGET:-00:03:00}; PYTEST_S=${PYTEST_S:-300}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  nproc; lscpu | grep 'Model name'
  $PY -c "import torch, lightning, litserve, datasets; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__, 'litserve', litserve.__version__, 'datasets', datasets.__version__)"
  git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | head
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Training speed, each config alone (quiet machine).
for cfg in transformer rnn_bahdanau; do
  echo "== nmt bench train --config configs/$cfg.yaml --steps $STEPS --warmup 5"
  timeout 100 $NMT bench train --config configs/$cfg.yaml --steps "$STEPS" --warmup 5 2>&1 | grep -E "^\||^prec|rror"
  echo "exit ${PIPESTATUS[0]}"
done > "$OUT/bench_train.txt" 2>&1
cat "$OUT/bench_train.txt"

# 2. The suite on a machine with CUDA (tests that train pin the CPU; decoding ones default to
#    the GPU), beside two short trainings of the defaults.
if [ -z "$LOCAL" ]; then
  ( timeout "$PYTEST_S" $PY -m pytest -q -n 8 --dist loadfile -rfE -p no:cacheprovider tests \
      --ignore=tests/test_export.py > "$OUT/pytest.txt" 2>&1; echo "pytest exit $?" >> "$OUT/pytest.txt" ) &
fi
for cfg in transformer rnn_bahdanau; do
  ( echo "== nmt train --config configs/$cfg.yaml --max-time $BUDGET --run-dir checkpoints/g_$cfg"
    timeout 260 $NMT train --config configs/$cfg.yaml --max-time "$BUDGET" --run-dir checkpoints/g_$cfg \
        --trainer.enable_progress_bar false 2>&1 | grep -vE "^\s*\||^---|Params|params|Modules|Total"
    echo "exit ${PIPESTATUS[0]} at $(date -u)" ) > "$OUT/train_$cfg.log" 2>&1 &
done
wait
T=checkpoints/g_transformer; R=checkpoints/g_rnn_bahdanau
# 3. Decoding as a user would.
{
  for run in $T $R; do echo "== evaluate $run"; timeout 60 $NMT evaluate --checkpoint $run; echo "exit $?"; done
  echo "== translate stdin"
  printf 'Ein Hund läuft durch den Schnee.\nZwei Männer spielen Fußball.\n' | timeout 60 $NMT translate --checkpoint $T; echo "exit $?"
  echo "== translate nbest"
  printf 'Ein Hund läuft durch den Schnee.\n' | timeout 60 $NMT translate --checkpoint $T --beam 5 --nbest 3; echo "exit $?"
  echo "== translate 32-true"
  printf 'Ein Hund läuft durch den Schnee.\n' | timeout 60 $NMT translate --checkpoint $T --precision 32-true; echo "exit $?"
  echo "== average"; timeout 60 $NMT average --checkpoint $T --last 3; echo "exit $?"
  echo "== translate averaged"
  printf 'Ein Hund läuft durch den Schnee.\n' | timeout 60 $NMT translate --checkpoint $T --weights averaged.ckpt; echo "exit $?"
  echo "== ensemble T + R"
  printf 'Ein Hund läuft durch den Schnee.\n' | timeout 60 $NMT translate --checkpoint $T --ensemble $R; echo "exit $?"
  echo "== attention plot"
  printf 'Ein Hund läuft durch den Schnee.\n' | timeout 60 $NMT translate --checkpoint $R --plot-attention /tmp/att; echo "exit $?"; ls /tmp/att
} > "$OUT/decode.txt" 2>&1
{
  echo "== serve"
  $NMT serve --checkpoint $T $R --port 8000 > /tmp/serve.log 2>&1 &
  SERVE=$!
  for _ in $(seq 90); do curl -sf localhost:8000/health > /dev/null && break; sleep 1; done
  curl -s localhost:8000/translate -H 'Content-Type: application/json' \
     -d '{"text": ["Ein Hund läuft durch den Schnee.", "Zwei Männer spielen Fußball."], "beam": 5, "model": "g_rnn_bahdanau"}'
  echo; curl -s localhost:8000/translate -H 'Content-Type: application/json' -d '{"text": ["Ein Hund."], "attention": true}' | head -c 400
  echo; kill $SERVE; wait $SERVE; echo "serve exit $?"; tail -n 20 /tmp/serve.log
  echo "== bench decode"
  timeout 90 $NMT bench decode --checkpoint $T --beam 1,5 --repeat 2 2>&1 | grep -E "^\||^prec|rror"
} > "$OUT/serve_bench.txt" 2>&1
tar czf "$OUT/runs.tar.gz" --exclude='*.ckpt' $T $R
tail -n 5 "$OUT"/train_*.log; cat "$OUT/decode.txt" "$OUT/serve_bench.txt"; tail -n 30 "$OUT/pytest.txt" 2>/dev/null
