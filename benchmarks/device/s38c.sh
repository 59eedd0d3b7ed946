#!/bin/bash
# Stop 38 after the pool's NVFP4 words moved to sm order: the engine at matched concurrency (26 x 32K, dummy
# Llama-3.1-8B, fp8 vs nvfp4, 128 output tokens, 3 profiled steps), the balanced kernel at pf=1 / 0 and the
# full kernel benchmark, one call.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s38c.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/engine" "$OUT/kernels" "$OUT/bal"
timeout -k 5 200 python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
  --kv-dtypes fp8_e4m3 nvfp4 \
  --long-requests 26 --long-output 128 --profile-steps 3 --out "$OUT/engine" > "$OUT/engine/engine.log" 2>&1
echo "engine exit $?"; grep -E "decode_tok_s|tok/s|step" "$OUT/engine/engine.log" | tail -8
# the token-balanced kernel (>= 256 pairs) spills 32 bytes at its default pf=1 since the sm order,
# none at pf=0
timeout -k 5 80 python3 benchmarks/bench_decode_variants.py --out "$OUT/bal" --variants nvfp4=mma:bal=1 \
  nvfp4=mma:bal=1,pf=0 nvfp4=mma:bal=1 --shapes 64x32768 128x8192 32x8192 > "$OUT/bal/bal.log" 2>&1
echo "bal exit $?"; grep -E "^nvfp4" "$OUT/bal/bal.log" | tail -3
timeout -k 5 330 python3 benchmarks/bench_kernels.py --out "$OUT/kernels" > "$OUT/kernels/kernels.log" 2>&1
echo "kernels exit $?"; tail -25 "$OUT/kernels/kernels.log"
ls -R "$OUT"
