#!/bin/bash
# Gated DeltaNet decode (issue 50): benchmarks/bench_linear.py on one GPU -- one linear-attention layer's
# conv + gated-delta-rule decode step at Qwen3.5-27B's heads for 1-256 requests: kernels.linear's in-place
# kernels (float32 and bf16 recurrent states) against the path they replaced (gather the states, fla-core's fused recurrent kernel, scatter),
# each checked against the twins first, CUDA-graph replays with L2 emptied per call. ~1 min on an H200.
# fla-core travels as a wheel in .whl/ (installed into /tmp/site here).
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/linear.sh
# Env: COMMIT (the commit under test), T_LINEAR (timeout in s, 300).
# $OUT gets: linear-decode-h200.json (rows n, variant, ssm_dtype, us, state_bytes, frac; speedup; commit, gpu, date),
# linear-decode-h200.log, gpu.txt.
set -o pipefail
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
carried_wheels
gpu_info
run_bench "${T_LINEAR:-300}" "$OUT/linear-decode-h200.log" 20 benchmarks/bench_linear.py --out "$OUT"
