#!/bin/bash
# Next stop's second call (written at stop 43): the L2 prefetch (variant option l2) in the 8-column kernels
# at 12 programs per SM -- the token-balanced kernel (bal=1, the default from 208 pairs; 168 registers, no
# spill with l2=1, 710 vs 680 SASS a step, sm_90 on CPU) -- and in per-pair decode_mma (16 per SM, 128
# registers: l2=1 builds without the 8-byte spill of the default, 702 vs 683 SASS). decode_mma16 gained
# 1.4-4% from l2=1 at 8 programs per SM (stop 43, s43-h200/l2.log); decode_mma at 16 gained nothing (stop
# 37). 1) GPU tests of the l2 paths; 2) A/B, two rounds in reverse order, GQA 4 with the tail and GQA 8.
# Usage from the repo root: OUT=... bash benchmarks/device/s44b.sh   (~7 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TEST_TIMEOUT=${TEST_TIMEOUT:-150} OUT=$OUT TEST_FILES="tests/test_kernels_decode_balanced.py \
  tests/test_kernels_decode.py::test_decode_mma tests/test_kernels_decode.py::test_decode_mma16" \
  bash benchmarks/device/tests.sh | head -6
export T_AB=${T_AB:-100}
# shellcheck source=benchmarks/device/ab_lib.sh
source benchmarks/device/ab_lib.sh
G4="--tail --shapes 64x32768 26x32768 128x8192 32x8192 8x32768"
ab_run l2bal new $G4 --variants nvfp4=mma nvfp4=mma:l2=1 nvfp4=mma:bal=1,l2=1 nvfp4=mma:bal=0,l2=1
ab_run l2bal new $G4 --variants nvfp4=mma:bal=0,l2=1 nvfp4=mma:bal=1,l2=1 nvfp4=mma:l2=1 nvfp4=mma
ab_run l2bal8 new --q-heads 64 --shapes 64x32768 8x32768 32x8192 --variants nvfp4=mma nvfp4=mma:l2=1
ab_summary "$OUT/l2bal*.json"
