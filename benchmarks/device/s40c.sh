#!/bin/bash
# Stop 40, last call: head_dim 64 B8x32K (the one NVFP4 row under 0.65; ~10.8 us of fixed cost a call) with
# the combine launched by programmatic dependent launch (pdl=1) and per-head combine programs (cdb=64), then
# the decode GPU tests the first call's 570 s did not reach (decode_mma at 12 programs per SM, the balanced
# kernel from 208 pairs). Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s40c.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} PYTHONPATH=.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 ${T_AB:-70} python3 benchmarks/bench_decode_variants.py --out "$OUT/d64b" --head-dim 64 \
  --shapes 8x32768 --variants nvfp4=mma nvfp4=mma:pdl=1 nvfp4=mma:cdb=64 nvfp4=mma > "$OUT/d64b.log" 2>&1
echo "== d64b exit $?"; grep -E "^ *nvfp4" "$OUT/d64b.log" | tail -8
T=tests/test_kernels_decode.py
TEST_TIMEOUT=${TEST_TIMEOUT:-240} TEST_FILES="tests/test_kernels_decode_balanced.py $T::test_decode_mma \
  $T::test_decode_gpu_paths $T::test_decode_gpu_variants $T::test_decode_mma16 $T::test_decode_mma_tma" \
  OUT=$OUT bash benchmarks/device/tests.sh
