#!/bin/bash
# Next stop's second call (written at stop 41), right after s42.sh on the same machine:
#   1) issue 4's floor row with >= 32 running requests for every dtype: 16K x 48 (bf16 holds 26 of 32K);
#   2) decode_mma16 (9-16 query columns a KV head: GQA 16, and the prefix of a 4-token extend chunk at
#      GQA 4) at 8 vs 12 programs per SM (`wppsm`): sm_90 ptxas fits it in 168 registers with no spill and
#      a 769- vs 762-SASS main loop (stop 41, sass_decode.py --group 16 --variants mma:wppsm=12); at head_dim
#      64 the same move 8 -> 12 read +11-18% (stop 39). NVFP4 extend at 4-token chunks read 0.569 at
#      b4efb17 (target 0.60), its prefix runs decode_mma16;
#   3) the GPU tests the stop 41 calls did not reach (the rest of test_kernels_decode.py and friends).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s42b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/floor"
timeout -k 5 "${T_FLOOR:-200}" python3 benchmarks/bench_engine.py --part long --synthetic-prefill \
  --long-input 16384 --long-requests 48 --long-output 16 --out "$OUT/floor" > "$OUT/floor/engine.log" 2>&1
echo "floor exit $?"; grep -E "^kv_dtype|^bf16|^fp8|^nvfp4" "$OUT/floor/engine.log" | tail -4
export T_AB=${T_AB:-70}
# shellcheck source=benchmarks/device/ab_lib.sh
source benchmarks/device/ab_lib.sh
W="--q-heads 128 --shapes 64x8192 32x8192 8x32768 128x8192"
for _ in 1 2; do
  ab_run wppsm new $W --variants nvfp4=mma:wppsm=8 nvfp4=mma:wppsm=12
  ab_run wppsm new $W --variants nvfp4=mma:wppsm=12 nvfp4=mma:wppsm=8
done
ab_summary "$OUT/wppsm.json"
T=tests/test_kernels_decode.py
TEST_TIMEOUT=${TEST_TIMEOUT:-200} TEST_FILES="$T tests/test_engine_gpu.py tests/test_kernels_extend.py" \
  OUT=$OUT bash benchmarks/device/tests.sh | head -8
