#!/bin/bash
# One H200 call (~9 min): bal auto (default since 008fc4e) vs per-pair mma at B>=32, the whole kernel benchmark, the
# engine long part (nvfp4: matched 26 requests, capacity ~91).
# Usage: OUT=... COMMIT=<sha> bash benchmarks/device/balanced_default.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/engine" "$OUT/kernels" "$OUT/bal"
timeout -k 5 150 python3 benchmarks/bench_decode_variants.py --out "$OUT/bal" --budget-s 120 --tail \
  --shapes 32x8192 64x32768 128x8192 32x32768 --variants nvfp4=mma:bal=0 nvfp4=mma nvfp4=mma:bal=1 > "$OUT/bal/log" 2>&1
echo "bal exit $?"; grep -v arn "$OUT/bal/log" | tail -9
timeout -k 5 270 python3 benchmarks/bench_kernels.py --out "$OUT/kernels" > "$OUT/kernels/kernels-h200.log" 2>&1
echo "kernels exit $?"; tail -3 "$OUT/kernels/kernels-h200.log"
timeout -k 5 150 python3 benchmarks/bench_engine.py --part long --synthetic-prefill --kv-dtypes nvfp4 \
    --long-output 64 --out "$OUT/engine" > "$OUT/engine/log" 2>&1
echo "engine exit $?"; grep -v '^{' "$OUT/engine/log" | grep -v Warn | tail -4
