#!/bin/bash
# Stop 30, the closing H200 call (~8 min): (1) GPU tests of every decode / extend kernel and both combine
# steps (one program per (request, KV head) now); only if they pass: (2) per-kernel times (decode vs
# combine) at the shapes device/s30.sh timed with the old combine, and mma:tw=1 (the tail programs inside
# the one wave); (3) the whole kernel benchmark; (4) the engine's matched 32K row at 1024 output tokens
# (issue 4), profiled.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s30c.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
gpu_tests combine 150 tests/test_kernels_decode.py tests/test_kernels_decode_balanced.py \
  tests/test_kernels_extend.py -k "combine or active_rows or test_decode_variants or many_slots or tail_only \
  or gqa_group or matches_reference or balanced or split_prefix" || exit 1
timeout -k 5 75 python3 benchmarks/bench_decode_variants.py --out "$OUT/v" --budget-s 45 --tail --breakdown \
  --shapes 26x32768 8x32768 32x8192 64x8192 128x8192 1x131072 \
  --variants nvfp4=mma nvfp4=mma:tw=1 fp8_e4m3=tok \
  > "$OUT/decode-variants-combine-h200.log" 2>&1
echo "variants exit $?"; grep "graph" "$OUT/decode-variants-combine-h200.log"
rm -rf "$OUT/v"
timeout -k 5 220 python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; tail -5 "$OUT/kernels-h200.log"
engine matched-out1024 90 --part long --long-model llama-3.1-8b --synthetic-prefill --long-input 32768 \
  --long-requests 26 --long-output 1024 --profile-steps 4 --kv-dtypes fp8_e4m3 nvfp4
ls "$OUT"
