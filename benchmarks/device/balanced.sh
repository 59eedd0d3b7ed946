#!/bin/bash
# One H200 call (~8 min) for decode_mma's token-balanced split-K (variant option bal=1, stop 21; built and
# interpreter-tested, compiled for sm_90 on CPU in stop 22 -- a constexpr bug fixed there -- never run on a GPU):
#   1) GPU tests (the kernel against the reference, schedule invariants);
#   2) kernel A/B: default mma vs bal=1 in its three builds (tpi=2 pf=1 spills ~5 values into its tile loop on
#      sm_90; pf=0 and tpi=1 do not) and fp8 tok, at uniform shapes -- 91 requests (728 pairs: 1456 of 2112
#      warp slots busy by default), 26, 8, 1 -- and ragged batches (one or four 32K requests among short ones).
# Then the engine: VARIANT=<the best bal build> bash benchmarks/device/balanced_engine.sh
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/balanced.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/variants"
timeout -k 5 150 python3 -m pytest -q tests/test_kernels_decode_balanced.py > "$OUT/tests.log" 2>&1
echo "pytest exit $?"; tail -2 "$OUT/tests.log"
timeout -k 5 400 python3 benchmarks/bench_decode_variants.py --out "$OUT/variants" --budget-s 360 --tail --breakdown \
  --shapes 91x32768 26x32768 8x32768 1x131072 --ragged 1x32768+63x1024 4x32768+60x2048 \
  --variants nvfp4=mma nvfp4=mma:bal=1 nvfp4=mma:bal=1,pf=0 nvfp4=mma:bal=1,tpi=1 fp8_e4m3=tok \
  > "$OUT/variants.log" 2>&1
echo "variants exit $?"; grep -v "arn" "$OUT/variants.log" | tail -24
