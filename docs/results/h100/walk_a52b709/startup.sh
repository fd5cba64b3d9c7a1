#!/bin/bash
# Second call: start-up wall time of decoding commands and serve on a tiny run, then the suite alone.
# Call 2 ran it as is (the suite beside the timings: startup_beside_suite.txt); call 3 with the
# pytest line skipped (quiet: startup.txt).
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; PY=python3
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NMT_CACHE_DIR=/tmp/nmt_cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site gpu_carry/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p data; rm -rf data/multi30k; cp -r gpu_carry/multi30k data/multi30k
( timeout 210 $PY -m pytest -q -n 12 --dist loadfile -rfE -p no:cacheprovider tests --ignore=tests/test_export.py > "$OUT/pytest.txt" 2>&1; echo "pytest exit $?" >> "$OUT/pytest.txt" ) &
PT=$!
{
TIMEFORMAT='wall %R s'; T=gpu_carry/tiny
for mod in torch nmt.cli nmt.translator nmt.serve lightning; do $PY -c "import $mod"; echo "import $mod"; time $PY -c "import $mod"; done
for i in 1 2; do echo "== translate"; time (echo 'Ein Hund.' | $PY -m nmt translate --checkpoint $T > /dev/null); done
echo "== evaluate"; time ($PY -m nmt evaluate --checkpoint $T > /dev/null)
echo "== serve"; s=$(date +%s%N)
$PY -m nmt serve --checkpoint $T --port 8000 > "$OUT/serve.log" 2>&1 & SV=$!
for _ in $(seq 600); do curl -sf -m 1 localhost:8000/health > /dev/null && break; sleep 0.1; done
echo "healthy after $(( ($(date +%s%N) - s) / 1000000 )) ms"; kill -TERM $SV; sleep 2; kill -KILL $SV 2>/dev/null
} > "$OUT/startup.txt" 2>&1
cat "$OUT/startup.txt"; wait $PT; tail -n 40 "$OUT/pytest.txt"
