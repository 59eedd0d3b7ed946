#!/bin/bash
# This stop's second call: decode_mma16's L2 prefetch (variant option l2 = steps ahead) on the H200.
# Why: at 8 one-warp programs per SM ptxas issues the next step's register loads ~260 of a step's ~760 SASS
# before use (stop 42) -- less than a loaded DRAM round trip, with one other warp per scheduler to cover it.
# sm_90 (CPU): l2=1/2 build at 225 registers, no spill, 788 SASS a step (762 without).
#   1) GPU tests of the new paths (decode_mma16 with l2, the own-chunk launch defaults);
#   2) decode at GQA 16 (128 query heads over 8), mma vs mma:l2=1 vs mma:l2=2, two rounds, order swapped;
#   3) extend_decode (new own-chunk defaults) with the prefix decode at l2 = 0 / 1 / 2, per-kernel breakdown.
# Usage from the repo root: OUT=... bash benchmarks/device/s43b.sh   (~6 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/extend"
TEST_TIMEOUT=${TEST_TIMEOUT:-150} OUT=$OUT \
  TEST_FILES="tests/test_kernels_decode.py::test_decode_mma16 tests/test_kernels_extend_decode.py" \
  bash benchmarks/device/tests.sh | head -6
export T_AB=${T_AB:-90}
# shellcheck source=benchmarks/device/ab_lib.sh
source benchmarks/device/ab_lib.sh
W="--q-heads 128 --shapes 64x8192 32x8192 8x32768 128x8192"
ab_run l2 new $W --variants nvfp4=mma nvfp4=mma:l2=1 nvfp4=mma:l2=2
ab_run l2 new $W --variants nvfp4=mma:l2=2 nvfp4=mma:l2=1 nvfp4=mma
ab_summary "$OUT/l2.json"
timeout -k 5 "${T_EXT:-200}" python3 benchmarks/bench_extend.py --breakdown --configs 0:0:0:0:0:0:0:1 \
  --decode-opts "" l2=1 l2=2 --shapes 64x8192x4 32x32768x4 64x8192x2 64x8192x8 --out "$OUT/extend" \
  > "$OUT/extend/extend.log" 2>&1
echo "extend exit $?"; grep -E "^extend_decode nvfp4" "$OUT/extend/extend.log" | cut -c1-170
