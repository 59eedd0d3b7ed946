#!/bin/bash
# Stop 36: the combine step's loads before lens (one memory round trip) and chunks of up to 8192 elements
# (variant option ce=1, the default) against the combine as before (ce=0), one machine, one call:
#   1) the GPU tests of the combine paths (decode_mma's empty splits, CUDA-graph padding rows, balanced,
#      extend splits);
#   2) bench_decode_variants, A/B/A/B (ce=0, ce=1, ce=0 again, ce=1 again) at the acceptance rows that miss
#      0.65: GQA 4 and GQA 8 (head_dim 128) and head_dim 64, plus FP8 tok at GQA 4.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s36.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/gpu-tests-s36-h200.log
timeout -k 5 ${T_TESTS:-200} python3 -m pytest -v -rfE tests/test_kernels_decode.py \
  tests/test_kernels_decode_balanced.py tests/test_kernels_extend.py \
  -k "combine or empty or active or balanced or split" > "$LOG" 2>&1
echo "tests exit $? ($(grep -c PASSED "$LOG") passed)"; tail -2 "$LOG"
ab() {  # $1 = tag, $2 = dtype, $3 = variant, rest = bench_decode_variants args
  local tag=$1 dt=$2 v=$3; shift 3
  timeout -k 5 ${T_AB:-110} python3 benchmarks/bench_decode_variants.py --out "$OUT/$tag" \
    --variants "$dt=$v:ce=0" "$dt=$v:ce=1" "$dt=$v:ce=0,pdl=0" "$dt=$v:ce=1,pdl=0" "$@" > "$OUT/$tag.log" 2>&1
  echo "$tag exit $?"; sed -n '/^dtype/,/^best/p' "$OUT/$tag.log"
  mv "$OUT/$tag/decode-variants.json" "$OUT/$tag.json" 2>/dev/null; rmdir "$OUT/$tag" 2>/dev/null
}
ab combine-gqa4-h200 nvfp4 mma --shapes 8x32768 32x8192 26x32768 1x131072 64x8192
ab combine-gqa8-h200 nvfp4 mma --q-heads 64 --shapes 8x32768 32x8192 1x131072 64x8192
ab combine-d64-h200 nvfp4 mma --head-dim 64 --shapes 8x32768 64x8192 32x8192 1x131072
ab combine-fp8-h200 fp8_e4m3 tok --shapes 8x32768 32x8192 1x131072
ls "$OUT"
