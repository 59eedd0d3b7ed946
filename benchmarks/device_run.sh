#!/bin/bash
# One device call: GPU correctness tests (odd lengths, all paths, decode variants at D 64/128/256, the engine
# with CUDA graphs and the nvfp4 defaults), then the kernel benchmark.
# Usage on the GPU machine: bash benchmarks/device_run.sh [bench_kernels.py args...]; results land in $OUT.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,memory.used --format=csv
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -x -q tests/test_kernels_write.py tests/test_kernels_decode.py \
    tests/test_kernels_extend.py tests/test_kernels_dispatch.py tests/test_engine_gpu.py 2>&1 | tee "$OUT/tests.log" | tail -15
python3 benchmarks/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
