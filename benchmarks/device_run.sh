#!/bin/bash
# One device call: GPU correctness tests (odd lengths, all paths, decode variants at D 64/128/256, the fused
# model kernels, the engine with CUDA graphs and the nvfp4 defaults), the extend launch-config sweep, then
# the kernel benchmark.
# Usage on the GPU machine: bash benchmarks/device_run.sh [bench_kernels.py args...]; results land in $OUT.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,memory.used --format=csv
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q tests/test_kernels_write.py tests/test_kernels_decode.py \
    tests/test_kernels_extend.py tests/test_kernels_dispatch.py tests/test_kernels_fused.py tests/test_engine_gpu.py \
    2>&1 | tee "$OUT/tests.log" | tail -15
# extend launch configs (prefix splits x stages x the own-chunk loop's stages -- 1 frees 2 programs per SM in the
# sm_90 compile, benchmarks/results/extend-sass.md; 8 warps and BM 32 were slower on 2026-11-30), then
# the whole kernel benchmark. GPU tests without -x: one failure must not hide the rest.
timeout "${EXTEND_TIMEOUT:-150}" python3 benchmarks/bench_extend.py --out "$OUT" \
    --configs ${EXTEND_CONFIGS:-1:0 4:0 4:2 1:0:0:0:0:1 4:0:0:0:0:1 1:7:0:0:0:1 4:7:0:0:0:1} 2>&1 | tee "$OUT/extend.log" | tail -40
python3 benchmarks/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
