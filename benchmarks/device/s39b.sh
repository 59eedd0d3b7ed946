#!/bin/bash
# Stop 39, after head_dim 64's decode_mma moved to 12 programs per SM (168 registers): the full kernel
# benchmark (issue 3's one run), then the engine at matched concurrency (26 x 32K, dummy Llama-3.1-8B, fp8 vs
# nvfp4, 128 output tokens, 3 profiled steps), one call.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s39b.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/engine" "$OUT/kernels"
timeout -k 5 ${T_KERNELS:-300} python3 benchmarks/bench_kernels.py --out "$OUT/kernels" \
  > "$OUT/kernels/kernels.log" 2>&1
echo "kernels exit $?"; tail -25 "$OUT/kernels/kernels.log"
timeout -k 5 ${T_ENGINE:-160} python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
  --kv-dtypes fp8_e4m3 nvfp4 \
  --long-requests 26 --long-output 128 --profile-steps 3 --out "$OUT/engine" > "$OUT/engine/engine.log" 2>&1
echo "engine exit $?"; grep -E "decode_tok_s|tok/s|step" "$OUT/engine/engine.log" | tail -8
ls -R "$OUT"
