#!/bin/bash
# One device call: the extend launch-config sweep, then the kernel benchmark (GPU tests: device/tests.sh,
# a call of their own; RUN_TESTS=1 runs a quick subset here first).
# Usage on the GPU machine: bash benchmarks/device/run.sh [bench_kernels.py args...]; results land in $OUT.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,memory.used --format=csv
if [ "${RUN_TESTS:-0}" = 1 ]; then
    timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q tests/test_kernels_write.py tests/test_kernels_page_copy.py \
        tests/test_kernels_dispatch.py 2>&1 | tee "$OUT/tests.log" | tail -15
fi
# extend launch configs: SPLITS:STAGES:WARPS:BM:BN:OWN:REGS (0 = default; the default own-key loop runs at
# 1 stage since 2026-11-30; REGS 168 was slower at every shape, extend-sweep-regs-h200.json). The default
# sweep times the auto split rule (0) against fixed splits, and extend_decode (DEC=1: the prefix of short
# chunks through the decode kernels; NVFP4 timed 2026-11-30 before its merge kernels, FP8 not yet; DEC=2: wide
# NVFP4 chunks through decode_tok instead of two decode_mma groups, untimed). 16/32-row
# query blocks (BM 16 / 32) were 2-4x slower at every shape (extend-sweep-bm-h200.json).
timeout "${EXTEND_TIMEOUT:-150}" python3 benchmarks/bench_extend.py --out "$OUT" \
    --configs ${EXTEND_CONFIGS:-0:0 2:0 0:0:0:0:0:0:0:1 0:0:0:0:0:0:0:2} 2>&1 | tee "$OUT/extend.log" | tail -40
python3 benchmarks/bench_kernels.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
