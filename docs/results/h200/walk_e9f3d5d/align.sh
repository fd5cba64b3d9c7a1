#!/bin/bash
# Second call: --alignment on CUDA after the fix (rows against the CPU's, fp32), --version, and
# the tracebacks of the tests that failed on this host's image in the first call.
PY=${PY:-python3}; OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NMT_CACHE_DIR=/tmp/nmt_cache
if [ -z "$LOCAL" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site gpu_carry/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  mkdir -p data; rm -rf data/multi30k; cp -r gpu_carry/multi30k data/multi30k
fi
NMT="$PY -m nmt"; BUDGET=${BUDGET:-00:00:45}
$NMT --version
( timeout 150 $PY -m pytest -q -n 5 -p no:cacheprovider --tb=short \
    "tests/test_bench.py::test_bench_attention_keeps_the_rows_that_fit_in_memory" \
    "tests/test_data.py::test_multi30k_batches_are_pinned" \
    "tests/test_cli.py::test_version_names_nmt_its_commit_and_its_libraries" \
    "tests/test_cli.py::test_a_folder_that_is_not_a_run_is_named_as_such" \
    "tests/test_cli.py::test_bad_input_gives_one_line_error" > "$OUT/pytest_failed.txt" 2>&1
  echo "pytest exit $?" >> "$OUT/pytest_failed.txt" ) &
PT=$!
for cfg in transformer rnn_bahdanau; do
  timeout 110 $NMT train --config configs/$cfg.yaml --max-time "$BUDGET" --run-dir checkpoints/a_$cfg \
      --trainer.enable_progress_bar false > "$OUT/train_$cfg.log" 2>&1 &
done
wait $(jobs -p | grep -v "^$PT$")
S='Ein Hund läuft durch den Schnee.\nZwei Männer spielen Fußball auf einer grünen Wiese.\nEine Frau mit einem roten Hut liest ein Buch.\n'
for cfg in transformer rnn_bahdanau; do
  run=checkpoints/a_$cfg; tail -n 3 "$OUT/train_$cfg.log"
  for opts in "" "--precision 32-true" "--device cpu --precision 32-true"; do
    echo "== translate --checkpoint $run --alignment $opts"
    printf "$S" | timeout 60 $NMT translate --checkpoint $run --alignment $opts 2>&1 | tee "$OUT/rows.txt" | grep -v "^decoding"
    echo "exit ${PIPESTATUS[1]}"; grep -v "^decoding" "$OUT/rows.txt" > "$OUT/rows_${cfg}_$(echo $opts | tr -dc 'a-z0-9')"
  done
  cmp "$OUT/rows_${cfg}_precision32true" "$OUT/rows_${cfg}_devicecpuprecision32true" && echo "$cfg: fp32 rows on CUDA == on the CPU"
done
wait $PT; cat "$OUT/pytest_failed.txt" | tail -n 120
