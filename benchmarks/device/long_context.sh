#!/bin/bash
# Long context (issues 47 and 50): benchmarks/bench_long_context.py on one GPU -- the published table's rows
# (32K / 160K / 1M input, 1,024 output, matched and capacity-driven) for the presets named, dummy weights.
# The hybrid Qwen3.5 preset needs fla-core: it travels as a wheel in .whl/ (installed into /tmp/site here).
# A 10-minute call holds one model and weight format: give --time-budget-s ~60 s under T_LONG (rows start
# only within it), then --merge the result files.
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/long_context.sh [bench flags]
#   e.g. ... long_context.sh --models qwen3.5-27b --quantization fp8 --input-lens 1048576 163840 32768
#        --ttft-requests 0 --time-budget-s 480
# Env: COMMIT (the commit under test), T_LONG (timeout in s, 560).
# $OUT gets: long-context-h200.{json,png} (or --name's), long-context-h200.log, gpu.txt.
set -o pipefail
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
carried_wheels
gpu_info
run_bench "${T_LONG:-560}" "$OUT/long-context-h200.log" 40 benchmarks/bench_long_context.py --out "$OUT" "$@"
