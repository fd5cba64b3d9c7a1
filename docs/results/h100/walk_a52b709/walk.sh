#!/bin/bash
# GPU walk-through at HEAD (one call): start-up times of each decoding command and of nmt serve
# (after translate/serve stopped importing Lightning), bench train, the suite on CUDA beside two
# short trainings.  Dry run: LOCAL=1 PY=.venv/bin/python OUT=/tmp/gw STEPS=2 BUDGET=00:00:20 PYTEST_S=5 bash gpu_carry/walk2.sh
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
STEPS=${STEPS:-40}; BUDGET=${BUDGET:-00:02:00}; PYTEST_S=${PYTEST_S:-200}
T0=$(date +%s); stamp() { echo "[t+$(( $(date +%s) - T0 )) s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  nproc; lscpu | grep 'Model name'
  $PY -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)"
  git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | head
  echo "== import times (s), second of two runs each"
  for mod in torch nmt.cli nmt.cli.decoding nmt.translator nmt.serve lightning; do
    $PY -c "import $mod" 2>/dev/null
    s=$(date +%s.%N); $PY -c "import $mod"; e=$(date +%s.%N); echo "import $mod: $(echo "$e - $s" | bc)"
  done
  $PY -X importtime -c "import nmt.serve" 2> "$OUT/importtime_serve.txt"
  sort -t'|' -k2 -n -r "$OUT/importtime_serve.txt" | head -12
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Training speed, each config alone (quiet machine).
for cfg in transformer rnn_bahdanau; do
  stamp "nmt bench train --config configs/$cfg.yaml --steps $STEPS --warmup 5"
  timeout 100 $NMT bench train --config configs/$cfg.yaml --steps "$STEPS" --warmup 5 2>&1 | grep -E "^\||^prec|rror"
  echo "exit ${PIPESTATUS[0]}"
done > "$OUT/bench_train.txt" 2>&1
cat "$OUT/bench_train.txt"

# 2. The suite on CUDA beside two short trainings of the defaults.
if [ -z "$LOCAL" ]; then
  ( timeout "$PYTEST_S" $PY -m pytest -q -n 8 --dist loadfile -rfE -p no:cacheprovider tests \
      --ignore=tests/test_export.py > "$OUT/pytest.txt" 2>&1; echo "pytest exit $?" >> "$OUT/pytest.txt" ) &
fi
for cfg in transformer rnn_bahdanau; do
  ( echo "== nmt train --config configs/$cfg.yaml --max-time $BUDGET --run-dir checkpoints/g_$cfg"
    timeout 200 $NMT train --config configs/$cfg.yaml --max-time "$BUDGET" --run-dir checkpoints/g_$cfg \
        --trainer.enable_progress_bar false 2>&1 | grep -vE "^\s*\||^---|Params|params|Modules|Total"
    echo "exit ${PIPESTATUS[0]} at $(date -u)" ) > "$OUT/train_$cfg.log" 2>&1 &
done
wait
stamp "trainings and suite done"
T=checkpoints/g_transformer; R=checkpoints/g_rnn_bahdanau
# 3. Start-up of each decoding command (wall seconds of the whole command), on a quiet machine.
timed() { local s=$(date +%s.%N); "$@"; local rc=$?; echo "exit $rc, wall $(echo "$(date +%s.%N) - $s" | bc) s"; }
{
  stamp "decode"
  for run in $T $R; do echo "== evaluate $run"; timed timeout 60 $NMT evaluate --checkpoint $run; done
  echo "== translate stdin (x2)"
  for i in 1 2; do printf 'Ein Hund läuft durch den Schnee.\nZwei Männer spielen Fußball.\n' | timed timeout 60 $NMT translate --checkpoint $T; done
  echo "== translate nbest"
  printf 'Ein Hund läuft durch den Schnee.\n' | timed timeout 60 $NMT translate --checkpoint $T --beam 5 --nbest 3
  echo "== ensemble T + R"
  printf 'Ein Hund läuft durch den Schnee.\n' | timed timeout 60 $NMT translate --checkpoint $T --ensemble $R
  echo "== serve"
  start=$(date +%s.%N)
  timeout 120 $NMT serve --checkpoint $T $R --port 8000 > "$OUT/serve.log" 2>&1 &
  SERVE=$!
  for _ in $(seq 1200); do curl -sf -m 1 localhost:8000/health > /dev/null && break; sleep 0.1; done
  echo "healthy (or gave up) after $(echo "$(date +%s.%N) - $start" | bc) s"
  curl -s -m 30 localhost:8000/translate -H 'Content-Type: application/json' \
     -d '{"text": ["Ein Hund läuft durch den Schnee.", "Zwei Männer spielen Fußball."], "beam": 5, "model": "g_rnn_bahdanau"}'
  echo; kill -TERM $SERVE; sleep 4; kill -KILL $SERVE 2>/dev/null; echo "serve stopped"
  stamp "bench decode"
  timeout 90 $NMT bench decode --checkpoint $T --beam 1,5 --repeat 2 2>&1 | grep -E "^\||^prec|rror"
  stamp "end"
} > "$OUT/decode.txt" 2>&1
tar czf "$OUT/runs.tar.gz" --exclude='*.ckpt' $T $R
tail -n 6 "$OUT"/train_*.log; cat "$OUT/decode.txt"; tail -n 25 "$OUT/pytest.txt" 2>/dev/null
