#!/bin/bash
# GPU tests on one GPU (docs/results.md): the tests that need CUDA -- kernels at odd shapes incl. the inline-
# PTX paths, the engine with CUDA graphs, the host tier's side stream. They compile many Triton
# specializations, a CPU-bound job: 10 xdist workers on an H200 machine's 16 cores run them in ~5-6 min
# (pyproject's -n 2, made for CI's 2 cores, does not finish in a 10-minute call). The decode file (the
# largest) goes last.
# Usage from the repo root: OUT=DIR bash benchmarks/device/tests.sh
# Env: TEST_FILES (the test files; default the GPU ones below), TESTS_ARGS (pytest flags, default -n 10),
# TEST_TIMEOUT (s, 570).
# $OUT gets: gpu-tests-h200.log (pytest -v output).
set -o pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # keeps carried wheels (fla-core)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# NOTE: -v: a run cut by the timeout prints no summary, so the log names each test's outcome as it ends.
DEFAULT_FILES="tests/test_kernels_ptx_mma.py tests/test_engine_overlap.py tests/test_kernels_extend_via_decode.py
    tests/test_kernels_page_copy.py tests/test_hicache.py tests/test_engine_gpu.py tests/test_kernels_extend_paged.py
    tests/test_kernels_write.py tests/test_kernels_ops_dispatch.py tests/test_kernels_fused.py tests/test_kernels_fp8.py
    tests/test_model_fp8.py tests/test_kernels_large_offsets.py tests/test_hybrid_gpu.py tests/test_kernels_linear.py
    tests/test_kernels_decode_balanced.py tests/test_kernels_decode.py"
FILES=""
for f in ${TEST_FILES:-$DEFAULT_FILES}; do  # a file renamed or removed is named, not a pytest usage error
    if [ -f "$f" ]; then FILES="$FILES $f"; else echo "tests.sh: no $f, skipped"; fi
done
LOG=$OUT/gpu-tests-h200.log
# shellcheck disable=SC2086
timeout -k 10 "${TEST_TIMEOUT:-570}" python3 -m pytest -v -rfE --durations=15 $FILES ${TESTS_ARGS:--n 10} >"$LOG" 2>&1
rc=$?
echo "pytest exit $rc ($(grep -c PASSED "$LOG") passed, $(grep -c SKIPPED "$LOG") skipped)"
grep -E " (FAILED|ERROR)" "$LOG" | head -30
tail -15 "$LOG"
exit $rc
