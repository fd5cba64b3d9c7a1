#!/bin/bash
# As run on the lent H100 (2026-11-27), from the repository root, with gpu_carry/ carried: the
# Multi30k files, wheels of what the GPU image lacks (datasets, dill, multiprocess, omegaconf
# 2.3, antlr4, litserve and its needs), and for diag.sh py-spy and a 5-step run (gpu_carry/tiny).
# Why `nmt serve` never answered on the H100 (walk.sh): the worker's setup in-process, then the
# server with stack dumps of every Python process after 30 s.
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NMT_CACHE_DIR=/tmp/nmt_cache
if [ -z "$LOCAL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site gpu_carry/whl/*.whl gpu_carry/tools/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
fi
RUN=gpu_carry/tiny
{
  echo "== setup in-process"
  timeout 60 $PY -c "
import faulthandler, sys, time; faulthandler.dump_traceback_later(40, exit=True)
from nmt.serve import TranslationAPI, parse_request
t = time.time(); api = TranslationAPI({'tiny': '$RUN'}, 'torch', 5, 32); api.setup('${DEV:-cuda:0}')
print('setup ok in', round(time.time() - t, 1), 's', api.translators['tiny'].device, api.translators['tiny'].precision)
print(api.predict([api.decode_request({'text': ['Ein Hund.']})]))
"
  echo "exit $?"
  echo "== serve"
  timeout 75 $PY -m nmt serve --checkpoint $RUN --port 8000 > "$OUT/serve.log" 2>&1 &
  for i in $(seq 30); do curl -sf -m 2 localhost:8000/health && { echo " healthy after $i s"; break; }; sleep 1; done
  ps -eo pid,ppid,stat,etime,cmd | grep -E "[p]ython|[n]mt" | cut -c1-160
  for pid in $(pgrep -f "nmt serve|multiprocessing|litserve|LitServer" ); do
    echo "-- py-spy dump $pid"; timeout 10 py-spy dump --pid "$pid" 2>&1 | head -60
  done
  curl -s -m 10 localhost:8000/translate -H 'Content-Type: application/json' -d '{"text": ["Ein Hund."]}'; echo " curl exit $?"
  pkill -TERM -f "nmt serve"; sleep 5; pkill -KILL -f "nmt serve"; pkill -KILL -f multiprocessing
  echo "== serve.log"; cat "$OUT/serve.log"
} > "$OUT/diag.txt" 2>&1
cat "$OUT/diag.txt"
# The suite's failures on a CUDA machine, by name (each test at most 45 s; the whole at most PYTEST_S).
[ -z "$LOCAL" ] && timeout "${PYTEST_S:-100}" $PY -m pytest -v --tb=line -n 14 -p no:cacheprovider --timeout 45 tests \
    --ignore=tests/test_export.py > "$OUT/pytest.txt" 2>&1
grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.txt" | tail -n 40
