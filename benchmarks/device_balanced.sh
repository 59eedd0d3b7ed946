#!/bin/bash
# One H200 call (~8 min) for decode_mma's token-balanced split-K (variant option bal=1, stop 21; built and
# interpreter-tested, never run on a GPU):
#   1) GPU tests (the kernel against the reference, schedule invariants), registers/spills in the variants log;
#   2) kernel A/B: default mma vs bal=1 (and fp8 tok) at uniform shapes -- 91 requests (728 pairs: 1456 of 2112
#      warp slots busy by default), 26, 8, 1 -- and ragged batches (one or four 32K requests among short ones);
#   3) the engine at capacity (dummy Llama-3.1-8B, 32K, nvfp4: 91 requests, 1.66x its floor in stop 21),
#      default vs NIBBLEKV_DECODE_VARIANT=mma:bal=1.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_balanced.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/variants" "$OUT/engine" "$OUT/engine-bal"
timeout -k 5 120 python3 -m pytest -q tests/test_kernels_decode_balanced.py > "$OUT/tests.log" 2>&1
echo "pytest exit $?"; tail -2 "$OUT/tests.log"
timeout -k 5 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/variants" --budget-s 170 --tail --breakdown \
  --shapes 91x32768 26x32768 8x32768 1x131072 --ragged 1x32768+63x1024 4x32768+60x2048 \
  --variants nvfp4=mma nvfp4=mma:bal=1 fp8_e4m3=tok > "$OUT/variants.log" 2>&1
echo "variants exit $?"; grep -v "arn" "$OUT/variants.log" | tail -16
for v in default bal; do
  ev=""; [ $v = bal ] && ev="NIBBLEKV_DECODE_VARIANT=mma:bal=1"
  d="$OUT/engine"; [ $v = bal ] && d="$OUT/engine-bal"
  env $ev timeout -k 5 100 python3 benchmarks/bench_engine.py --part long --synthetic-prefill --kv-dtypes nvfp4 \
    --long-output 64 --out "$d" > "$d/log" 2>&1
  echo "engine $v exit $?"; grep -v '^{' "$d/log" | grep -v Warn | tail -4
done
