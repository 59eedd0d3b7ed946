#!/bin/bash
# H200: decode_mma with an L2 prefetch of the next step (pf=2) or the one after (pf=3) -- ncu (stop 24,
# benchmarks/results/ncu-decode-h200.md) found ptxas sinks the register prefetch to the step's end under
# the 128-register cap, so each step waited a DRAM latency; also half the warps with 255 registers (ppsm=8).
# GPU tests first (the new pf specs; GQA groups over 16 now run as chunks of <= 16 heads).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_prefetch.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 170 python3 -m pytest -q tests/test_kernels_decode.py -k "group_over or (test_decode_mma and pf)" \
  > "$OUT/tests-prefetch.log" 2>&1
echo "tests exit $?"; tail -3 "$OUT/tests-prefetch.log"
timeout -k 5 230 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa4" --budget-s 190 --tail \
  --shapes 26x32768 8x32768 32x8192 1x131072 64x32768 128x8192 \
  --variants nvfp4=mma nvfp4=mma:pf=2 nvfp4=mma:pf=3 nvfp4=mma:ppsm=8,pf=2 fp8_e4m3=tok > "$OUT/gqa4.log" 2>&1
echo "gqa4 exit $?"; grep -v "arn" "$OUT/gqa4.log" | tail -32
timeout -k 5 130 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa8" --budget-s 95 --tail --q-heads 64 \
  --shapes 8x32768 32x8192 128x8192 --variants nvfp4=mma nvfp4=mma:pf=2 nvfp4=mma:pf=3 > "$OUT/gqa8.log" 2>&1
echo "gqa8 exit $?"; grep -v "arn" "$OUT/gqa8.log" | tail -12
