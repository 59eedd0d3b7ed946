#!/bin/bash
# Stop 31, third H200 call (~8 min): (1) issue 4's long part in one run at this tree -- dummy Llama-3.1-8B,
# 32K in / 1024 out, every dtype, matched (the most bf16 holds) and capacity-driven, profiled;
# (2) nvfp4's decode step at 256 requests x ~600 tokens profiled (device/s31b.sh ran out of time before it).
# (1) is committed as benchmarks/results/engine-h200.*; (2) hit its 100 s limit in stop 31 (no row).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s31c.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
engine long 420 --part long --long-model llama-3.1-8b --synthetic-prefill --long-input 32768 \
  --long-output 1024 --profile-steps 4
engine b256-ctx600-nvfp4 100 --part long --long-model llama-3.1-8b --synthetic-prefill --long-input 600 \
  --long-requests 256 --long-output 64 --profile-steps 4 --kv-dtypes nvfp4
ls "$OUT"
