#!/bin/bash
# One device call: the GPU tests (kernels at odd shapes incl. inline-PTX paths, the engine with CUDA graphs,
# the host tier's side stream). They compile many Triton specializations, a CPU-bound job: with 10 xdist
# workers on the device's 16 cores the whole suite ran in 260 s (493 passed, 12 skipped, 2026-12-03,
# benchmarks/results/s42-h200/gpu-tests-all.log); pyproject's -n 2 (for CI's 2 cores) cut it at 20-56% of
# 110-570 s calls. Newest first: the decode file (the largest) goes last.
# Usage on the GPU machine: bash benchmarks/device/tests.sh; the log lands in $OUT/tests.log.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# NOTE: -v: a run cut by the timeout prints no summary, so the log names each test's outcome as it ends
# (on 2026-11-30 a cut run's log showed only dots and two anonymous F's).
FILES=${TEST_FILES:-tests/test_kernels_mma_convert.py tests/test_engine_overlap.py tests/test_kernels_extend_decode.py \
    tests/test_kernels_page_copy.py tests/test_hicache.py tests/test_engine_gpu.py tests/test_kernels_extend.py \
    tests/test_kernels_write.py tests/test_kernels_dispatch.py tests/test_kernels_fused.py tests/test_kernels_decode.py}
timeout "${TEST_TIMEOUT:-570}" python3 -m pytest -v -rfE --durations=15 $FILES ${TESTS_ARGS:--n 10} >"$OUT/tests.log" 2>&1
echo "pytest exit $? ($(grep -c PASSED "$OUT/tests.log") passed, $(grep -c SKIPPED "$OUT/tests.log") skipped)"
grep -E " (FAILED|ERROR)" "$OUT/tests.log" | head -30
tail -15 "$OUT/tests.log"
