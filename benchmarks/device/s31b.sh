#!/bin/bash
# Stop 31, second H200 call (~6 min): where nvfp4 loses offline throughput on the 8B (0.92x bf16 at ecb21b2).
# (1) decode steps at the throughput bench's working point -- 256 running requests of ~600 tokens --
# profiled per kernel for every dtype (the long part with short synthetic prompts); (2) the offline
# throughput bench itself on the 8B, timed twice on one engine (first run / warm).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s31b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
engine b256-ctx600 170 --part long --long-model llama-3.1-8b --synthetic-prefill --long-input 600 \
  --long-requests 256 --long-output 64 --profile-steps 4
engine throughput-8b 300 --part throughput --throughput-models llama-3.1-8b --throughput-repeats 2
ls "$OUT"
