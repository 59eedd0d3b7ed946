#!/bin/bash
# Next stop's first call (written at stop 40): the NVFP4 converter by multiplies (the sm order with e1 / e5's
# magnitudes swapped, 6 masks + 1 shift + 2 multiplies a word; untimed at stop 40) -- first checked on the GPU
# (the converter's exhaustive test runs the real PTX there; the cache write; decode_mma), then timed against
# the tree before it (2f8c0dc: 6 masks + 5 shifts) in one call, new / old / new / old, then the engine.
# Usage from the repo root, the old tree unpacked as an untracked folder first (delete it after the call):
#   mkdir -p ab_old && git archive 2f8c0dc nibblekv | tar -x -C ab_old
#   OUT=... COMMIT=<sha> bash benchmarks/device/s41.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T=tests/test_kernels_decode.py
TEST_TIMEOUT=${TEST_TIMEOUT:-120} TEST_FILES="tests/test_kernels_mma_convert.py tests/test_kernels_write.py \
  $T::test_decode_mma_head_dim_64 $T::test_decode_mma_tail_in_grid $T::test_decode_gpu_paths" \
  OUT=$OUT bash benchmarks/device/tests.sh | head -8
export T_AB=${T_AB:-60}
# shellcheck source=benchmarks/device/ab_lib.sh
source benchmarks/device/ab_lib.sh
G4="--tail --shapes 26x32768 8x32768 32x8192 --variants nvfp4=mma"
D64="--head-dim 64 --shapes 8x32768 64x8192 --variants nvfp4=mma"
for tree in new old new old; do
  ab_run cvt-gqa4 $tree $G4
  ab_run cvt-d64 $tree $D64
done
ab_summary "$OUT/cvt-*.json"
mkdir -p "$OUT/engine"
PYTHONPATH=. timeout -k 5 ${T_ENGINE:-150} python3 benchmarks/bench_engine.py --part long \
  --synthetic-prefill --kv-dtypes fp8_e4m3 nvfp4 --long-requests 26 --long-output 128 --profile-steps 3 \
  --out "$OUT/engine" > "$OUT/engine/engine.log" 2>&1
echo "engine exit $?"; grep -E "^kv_dtype|^fp8|^nvfp4" "$OUT/engine/engine.log" | tail -3
