#!/bin/bash
# GPU walk-through at HEAD, one call on the lent H200 (2026-11-30): bash gpu_carry/walk.sh
# gpu_carry/ held the Multi30k files and wheels the image lacks or has in another version:
# datasets, dill, multiprocess, omegaconf, litserve, fastapi, starlette, uvicorn, pydantic(-core),
# annotated-types, typing-inspection, typing-extensions, pyzmq, opentelemetry-api, and
# sentencepiece 0.2.3 (the CPUs' version: the image's 0.2.2 cuts other pieces).
# 1. each bench alone; 2. the 10-minute trainings of both configs, de->en and en->de, all
# four at once; 3. test BLEU with the weights each run chose; translate --alignment; serve; bench decode.
# Dry run: LOCAL=1 PY=.venv/bin/python OUT=/tmp/gw STEPS=2 WARM=1 BUDGET=00:00:20 bash gpu_carry/walk.sh
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
STEPS=${STEPS:-40}; WARM=${WARM:-5}; BUDGET=${BUDGET:-00:10:00}; GUARD=${GUARD:-270}
T0=$(date +%s); stamp() { echo "[t+$(( $(date +%s) - T0 )) s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  nproc; lscpu | grep 'Model name'
  $NMT --version
  $PY -c "import pyarrow, sacrebleu; print('pyarrow', pyarrow.__version__, 'sacrebleu', sacrebleu.__version__)"
  git rev-parse --short HEAD 2>/dev/null; git status --short 2>/dev/null | grep -v gpu_carry | head
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Training speed, each config alone on the machine.
for cfg in transformer rnn_bahdanau; do
  stamp "nmt bench train --config configs/$cfg.yaml --steps $STEPS --warmup $WARM"
  timeout 100 $NMT bench train --config configs/$cfg.yaml --steps "$STEPS" --warmup "$WARM" 2>&1 | grep -vE "^\s*$"
  echo "exit ${PIPESTATUS[0]}"
done > "$OUT/bench_train.txt" 2>&1
cat "$OUT/bench_train.txt"

# 2. The 10-minute trainings, all four at once (a step here waits on Python and kernel launches;
#    on the H200 at 437c4d9 shared runs made the same updates as alone).
for cfg in transformer rnn_bahdanau; do for pair in de-en en-de; do
  src=${pair%-*}; tgt=${pair#*-}; run=checkpoints/g_${cfg}_$pair
  ( stamp "nmt train --config configs/$cfg.yaml --src-lang $src --tgt-lang $tgt --max-time $BUDGET --run-dir $run"
    timeout "$GUARD" $NMT train --config configs/$cfg.yaml --src-lang $src --tgt-lang $tgt \
        --max-time "$BUDGET" --run-dir $run --trainer.enable_progress_bar false 2>&1 \
        | grep -vE "^\s*\||^---|Params|params|Modules|Total"
    echo "exit ${PIPESTATUS[0]}"; stamp "done" ) > "$OUT/train_${cfg}_$pair.log" 2>&1 &
done; done
wait
# 3. Test BLEU, beam 5, with the weights each run chose (and best.ckpt), all at once.
for cfg in transformer rnn_bahdanau; do for pair in de-en en-de; do
  run=checkpoints/g_${cfg}_$pair
  ( echo "== nmt evaluate --checkpoint $run"; timeout 60 $NMT evaluate --checkpoint $run; echo "exit $?"
    echo "== nmt evaluate --checkpoint $run --weights best.ckpt"
    timeout 60 $NMT evaluate --checkpoint $run --weights best.ckpt; echo "exit $?"
  ) >> "$OUT/train_${cfg}_$pair.log" 2>&1 &
done; done
wait
T=checkpoints/g_transformer_de-en; R=checkpoints/g_rnn_bahdanau_de-en
S='Ein Hund läuft durch den Schnee.\nZwei Männer spielen Fußball auf einer grünen Wiese.\n'
{
  stamp "translate --alignment"
  for run in $T $R; do printf "$S" | timeout 40 $NMT translate --checkpoint $run --alignment; echo "exit $?"; done
  stamp "serve"; s=$(date +%s%N)
  timeout 60 $NMT serve --checkpoint $T $R --port 8000 > "$OUT/serve.log" 2>&1 & SV=$!
  for _ in $(seq 400); do kill -0 $SV 2>/dev/null || break; curl -sf -m 1 localhost:8000/health > /dev/null && break; sleep 0.1; done
  echo "healthy (or gave up) after $(( ($(date +%s%N) - s) / 1000000 )) ms"
  curl -s -m 20 localhost:8000/translate -H 'Content-Type: application/json' \
     -d '{"text": ["Ein Hund läuft durch den Schnee.", "Zwei Männer spielen Fußball."], "beam": 5, "model": "g_rnn_bahdanau_de-en"}'
  echo; kill -TERM $SV; sleep 2; kill -KILL $SV 2>/dev/null; echo "serve stopped"
  stamp "bench decode"
  timeout 60 $NMT bench decode --checkpoint $T --beam 1,5 --repeat 2 --no-recompute 2>&1 | grep -vE "^\s*$"
  stamp "end"
} > "$OUT/decode.txt" 2>&1
tar czf "$OUT/runs.tar.gz" --exclude='*.ckpt' checkpoints/g_*
tail -n 12 "$OUT"/train_*.log; cat "$OUT/decode.txt"
