#!/bin/bash
# Kernel benchmark (docs/results.md, decode kernels): benchmarks/bench_kernels.py on one GPU -- the read
# ceiling, paged decode (bf16 / fp8_e4m3 / nvfp4, with and without the 64-token bf16 tail, GQA 4 and 8,
# head_dim 128 and 64), extend over a cached prefix (extend_triton and extend_decode), the cache write, and
# torch SDPA on contiguous bf16 beside them. Each kernel is timed as a CUDA-graph replay with L2 emptied
# before every call (benchmarks/timing.py). ~5 min on an H200. `--head-dims 256` times only the hybrid
# models' head_dim-256 rows (GQA 6 and 8, benchmarks/bench_kernels_hd256.py), a call of its own: more than
# 330 s on an H200 (default kernels first, then the alternatives); give it T_KERNELS=590. Every row is printed
# to the log as it is timed, so a run cut by the timeout keeps what it measured.
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/kernels.sh [bench_kernels.py flags]
# Env: COMMIT (the commit under test: the device copy's git HEAD may differ), T_KERNELS (timeout in s, 540).
# $OUT gets: kernels-h200.json (rows, ceiling, commit, GPU, date), kernels-h200.png, kernels-h200.log (the
# run's output, a table last) and gpu.txt (nvidia-smi). A kernel A/B (variants side by side, each checked
# against the reference first) is benchmarks/device/decode_variants.sh (bench_decode_variants.py, several
# runs merged into one file) or bench_extend.py, run directly.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
gpu_info
run_bench "${T_KERNELS:-540}" "$OUT/kernels-h200.log" 45 benchmarks/bench_kernels.py --out "$OUT" "$@"
