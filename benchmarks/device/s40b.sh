#!/bin/bash
# Stop 40, the engine at matched concurrency (26 x 32K, fp8 vs nvfp4, 128 output tokens, 3 profiled steps)
# after BALANCED_MIN_PAIRS 256 -> 208 (26 requests x 8 KV heads run the token-balanced kernel). One call.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s40b.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/engine"
timeout -k 5 ${T_ENGINE:-240} python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
  --kv-dtypes fp8_e4m3 nvfp4 \
  --long-requests 26 --long-output 128 --profile-steps 3 --out "$OUT/engine" > "$OUT/engine/engine.log" 2>&1
echo "engine exit $?"; grep -E "^kv_dtype|^fp8|^nvfp4" "$OUT/engine/engine.log" | tail -4
grep -o "$(printf '%s' '"kv_dtype": "[a-z0-9_]*"\|"decode_tok_s": [0-9.]*\|' \
  '"kernel": "decode[a-z_]*", "ms_per_step": [0-9.]*')" \
  "$OUT/engine/engine.log"
