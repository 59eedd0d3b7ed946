#!/bin/bash
# Next stop's first call (written at stop 41): issue 4's acceptance rows in one run at this tree -- dummy
# Llama-3.1-8B, 32K in / 1024 out (the shape), every dtype, matched concurrency (the most bf16
# holds, 26) and capacity-driven (as many as each pool holds), profiled. Stop 41 measured 1.373x at 128 out
# (engine-matched-s41-h200/); the last run at 1024 out is fc20d6d's (1.27x, before the balanced kernel
# and the converter by multiplies). The >= 32-running floor row for bf16 (it holds 26 at 32K) is s42b.sh.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s42.sh  (~7-8 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/long"
timeout -k 5 "${T_LONG:-570}" python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
  --long-input 32768 --long-output 1024 --profile-steps 4 --out "$OUT/long" > "$OUT/long/engine.log" 2>&1
echo "long exit $?"
grep -E "^kv_dtype|^bf16|^fp8|^nvfp4" "$OUT/long/engine.log" | tail -7
