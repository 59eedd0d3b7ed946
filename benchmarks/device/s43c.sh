#!/bin/bash
# This stop's third call: issue 3's one-run kernel table at this tree (decode_mma16 with its L2 prefetch a
# step ahead by default, the own-chunk launch at 16-key blocks / 1 warp), then the whole GPU test suite.
# Usage from the repo root: OUT=... bash benchmarks/device/s43c.sh   (~9 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/kernels"
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)} timeout -k 5 "${T_KERNELS:-280}" \
  python3 benchmarks/bench_kernels.py --out "$OUT/kernels" > "$OUT/kernels/kernels.log" 2>&1
echo "kernels exit $?"; tail -4 "$OUT/kernels/kernels.log"
TEST_TIMEOUT=${TEST_TIMEOUT:-280} OUT=$OUT bash benchmarks/device/tests.sh | head -12
