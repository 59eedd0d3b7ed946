#!/bin/bash
# Stop 32, decode_mma16 (9-16 query columns a warp: extend's 3-4-token chunks at GQA 4 read the prefix once):
# (1) its GPU tests and extend_decode's; only if they pass: (2) decode at a GQA group of 16 (q_heads 128 over
# 8 KV heads), mma16 vs tok; (3) the whole kernel benchmark, whose extend rows now include 8-token chunks and
# the 8-column decode_mma groups (extend_decode_mma8) beside extend_decode. Six files under $OUT.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s32b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
gpu_tests s32 170 tests/test_kernels_decode.py tests/test_kernels_extend_decode.py \
  -k "mma16 or default_where or refuses or extend_decode or gather or routes or lse_out" || exit 1
run s32g16 90 --q-heads 128 --shapes 8x32768 32x8192 64x8192 --variants nvfp4=mma nvfp4=tok
timeout -k 5 240 python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; grep -E "extend" "$OUT/kernels-h200.log" | head -40; tail -3 "$OUT/kernels-h200.log"
ls "$OUT"
