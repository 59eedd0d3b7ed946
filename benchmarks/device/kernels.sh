#!/bin/bash
# One device call (<= 7 min): decode kernel variants side by side (benchmarks/bench_decode_variants.py).
# Each variant is checked against decode_ref on the GPU (odd lengths, bf16 tails) before it is timed; a
# variant that fails to compile or is wrong is reported and skipped. Results: $OUT/decode-variants.json,
# $OUT/variants.log (per-variant lines: regs, spills, TB/s and fraction of the probe ceiling; final table).
# Usage from the repo root: OUT=/some/dir bash benchmarks/device/kernels.sh [--variants nvfp4=tok:bn=64 ...]
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,memory.used --format=csv 2>&1 | tee "$OUT/gpu.txt"
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown) timeout "${BENCH_TIMEOUT:-390}" \
    python3 benchmarks/bench_decode_variants.py --out "$OUT" --budget-s "${BUDGET_S:-300}" "$@" 2>&1 | tee "$OUT/variants.log"
echo "exit ${PIPESTATUS[0]}"
