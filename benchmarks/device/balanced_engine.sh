#!/bin/bash
# One H200 call (~4 min): the engine at capacity (dummy Llama-3.1-8B, 32K in, nvfp4: 91 requests, 1.66x its
# memory floor in stop 21), the default decode_mma vs NIBBLEKV_DECODE_VARIANT=$VARIANT (default mma:bal=1,pf=0;
# pick the best build from benchmarks/device/balanced.sh first).
# Usage from the repo root:
#   OUT=... COMMIT=<sha> VARIANT=mma:bal=1,pf=0 bash benchmarks/device/balanced_engine.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
VARIANT=${VARIANT:-mma:bal=1,pf=0}
for v in default bal; do
  d="$OUT/engine-$v"; mkdir -p "$d"
  ev=""; [ $v = bal ] && ev="NIBBLEKV_DECODE_VARIANT=$VARIANT"
  env $ev timeout -k 5 110 python3 benchmarks/bench_engine.py --part long --synthetic-prefill --kv-dtypes nvfp4 \
    --long-output 64 --out "$d" > "$d/log" 2>&1
  echo "engine $v ($ev) exit $?"; grep -v '^{' "$d/log" | grep -v Warn | tail -4
done
