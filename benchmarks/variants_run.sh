#!/bin/bash
# Sourced by the device_s3*.sh scripts. run NAME SECONDS ARGS... = one bench_decode_variants.py call (ARGS
# passed on, e.g. --breakdown --tail --shapes ... --variants ...)
# -> $OUT/decode-variants-NAME-h200.{json,log},
# then the log's summary table.
run() {
  local name=$1 secs=$2; shift 2
  timeout -k 5 "$secs" python3 benchmarks/bench_decode_variants.py --out "$OUT/$name" \
    --budget-s $((secs - 40)) "$@" > "$OUT/decode-variants-$name-h200.log" 2>&1
  echo "$name exit $?"
  cp "$OUT/$name/decode-variants.json" "$OUT/decode-variants-$name-h200.json" 2>/dev/null; rm -rf "$OUT/$name"
  grep -A30 "^dtype" "$OUT/decode-variants-$name-h200.log" | grep -v "^$" | head -30
}

# engine NAME SECONDS ARGS... = one bench_engine.py call (ARGS passed on, e.g. --part long ...) ->
# $OUT/engine-NAME-h200.{json,log,png}, then the log's summary table.
engine() {
  local name=$1 secs=$2; shift 2
  timeout -k 5 "$secs" python3 benchmarks/bench_engine.py --out "$OUT/e-$name" "$@" \
    > "$OUT/engine-$name-h200.log" 2>&1
  echo "engine $name exit $?"; grep -A8 "^kv_dtype\|^model " "$OUT/engine-$name-h200.log" | head -12
  cp "$OUT/e-$name/bench_engine.json" "$OUT/engine-$name-h200.json" 2>/dev/null
  cp "$OUT/e-$name/bench_engine.png" "$OUT/engine-$name-h200.png" 2>/dev/null; rm -rf "$OUT/e-$name"
}

# gpu_tests NAME SECONDS PYTEST_ARGS... = the GPU tests -> $OUT/gpu-tests-NAME.log; fails (status 1) when
# a test failed or errored. NOTE: a timeout (124) with nothing failed so far counts as a pass (the
# benchmarks run).
gpu_tests() {
  local name=$1 secs=$2; shift 2
  timeout -k 5 "$secs" python3 -m pytest -q -x -o addopts="" "$@" > "$OUT/gpu-tests-$name.log" 2>&1
  echo "gpu tests exit $?"; tail -2 "$OUT/gpu-tests-$name.log"
  ! grep -qE "[0-9]+ (failed|error)|^FAILED|^ERROR" "$OUT/gpu-tests-$name.log"
}
