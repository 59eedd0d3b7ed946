#!/bin/bash
# Stop 31, the first H200 call (~9 min): (1) GPU tests of the decode / extend kernels and both combine steps
# at af879ae (its review mend was never run on a GPU); only if they pass: (2) per-kernel times (decode vs
# combine) where the small-grid rule (a combine program per query head below 132 (request, KV head) pairs)
# applies -- B8x32K, B1x128K -- and at B26x32K, head_dim 128 and 64; (3) the whole kernel benchmark (a
# rerun on whichever H200 this is); (4) the engine's matched 32K row at 1024 output tokens (issue 4).
# NOTE: it leaves 11 files under $OUT and the device returns 8: the kernel benchmark was rerun alone.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s31.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
gpu_tests s31 130 tests/test_kernels_decode.py tests/test_kernels_decode_balanced.py \
  tests/test_kernels_extend.py -k "combine or active_rows or test_decode_variants or many_slots or tail_only \
  or gqa_group or matches_reference or balanced or split_prefix" || exit 1
run s31a 70 --tail --breakdown --shapes 8x32768 1x131072 26x32768 --variants nvfp4=mma fp8_e4m3=tok
run s31b 55 --tail --breakdown --head-dim 64 --shapes 8x32768 64x8192 --variants nvfp4=mma fp8_e4m3=tok
timeout -k 5 215 python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; tail -3 "$OUT/kernels-h200.log"
engine matched-out1024 90 --part long --long-model llama-3.1-8b --synthetic-prefill --long-input 32768 \
  --long-requests 26 --long-output 1024 --profile-steps 4 --kv-dtypes fp8_e4m3 nvfp4
ls "$OUT"
