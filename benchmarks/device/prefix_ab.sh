#!/bin/bash
# One H200 call (~9 min): issue 6's agentic sweep in one run (every dtype, overlap schedule, host tier at the
# top concurrency), then decode_mma's minimum tokens per split at 1-2 requests (bench_small_ab).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/prefix_ab.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 440 python3 benchmarks/bench_prefix.py --out "$OUT" --workloads agentic --kv-dtypes fp8_e4m3 nvfp4 bf16 \
  --top-only hicache+bf16 --repeats 3 --enable-overlap-schedule > "$OUT/prefix-h200.log" 2>&1
echo "prefix exit $?"; grep -v "^{\|arn" "$OUT/prefix-h200.log" | tail -24
timeout -k 5 110 python3 benchmarks/bench_small_ab.py --out "$OUT" --requests 1 2 \
  --only fp8 nvfp4 "nvfp4 minc32" "nvfp4 minc128" "nvfp4 minc256" > "$OUT/small-ab.log" 2>&1
echo "small-ab exit $?"; grep -v "^{\|arn" "$OUT/small-ab.log" | tail -12
