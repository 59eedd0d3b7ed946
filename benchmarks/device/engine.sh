#!/bin/bash
# One call on one H200 (issue 4): the engine's acceptance rows, each step logged to a file under $OUT.
#   1) 32K context, fp8_e4m3 vs nvfp4 at 24 requests (bf16's capacity) and 48 (just under fp8's):
#      matched-concurrency decode throughput, with a per-step kernel profile;
#   2) 16K context, every dtype at 48 requests: the step vs its memory floor with >= 32 running requests
#      (bf16 cannot hold 32 requests of 32K on one H200).
# Usage from the repo root: OUT=... bash benchmarks/device/engine.sh  (env: LONG_TIMEOUT, FLOOR_TIMEOUT,
# ENGINE_ARGS: extra bench_engine.py flags for both parts, e.g. --enable-overlap-schedule)
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/matched" "$OUT/floor"
timeout "${LONG_TIMEOUT:-300}" python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
    --long-requests 24 48 --long-output 16 --kv-dtypes fp8_e4m3 nvfp4 --profile-steps 2 ${ENGINE_ARGS:-} \
    --out "$OUT/matched" >"$OUT/matched.log" 2>&1
echo "matched 32K: exit $?" | tee -a "$OUT/summary.txt"
timeout "${FLOOR_TIMEOUT:-240}" python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
    --long-input 16384 --long-requests 48 --long-output 16 ${ENGINE_ARGS:-} --out "$OUT/floor" >"$OUT/floor.log" 2>&1
echo "floor 16K x 48: exit $?" | tee -a "$OUT/summary.txt"
for f in "$OUT"/matched.log "$OUT"/floor.log; do
    echo "== $f"
    tail -n 8 "$f"
done
