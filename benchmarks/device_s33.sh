#!/bin/bash
# Stop 33: (0) extend_decode's and extend's GPU tests (the merge now in extend_triton's epilogue); (1) extend_decode's per-kernel GPU times (gather, decode,
# combine, own-key extend_triton, merge) at 2 / 4 / 8-token chunks over 8K prefixes, B=64, GQA 4;
# (2) decode with each request's pages in sequence vs at random places, at the shapes whose NVFP4 fraction
# falls as B x ctx grows (64 x 128K) and at small ones, NVFP4 / FP8 / BF16.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_s33.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
gpu_tests s33 150 tests/test_kernels_extend_decode.py tests/test_kernels_extend.py || exit 1
timeout -k 5 150 python3 benchmarks/bench_extend.py --out "$OUT/x" --breakdown --configs 0:0 0:0:0:0:0:0:0:1 \
  --shapes 64x8192x2 64x8192x4 64x8192x8 > "$OUT/extend-breakdown-s33-h200.log" 2>&1
echo "extend exit $?"; cp "$OUT/x/extend-sweep.json" "$OUT/extend-breakdown-s33-h200.json"; rm -rf "$OUT/x"
grep -E "^extend" "$OUT/extend-breakdown-s33-h200.log" | cut -c1-400
for order in random sequential; do
  run "s33-$order" 130 --page-order $order --shapes 8x131072 64x131072 128x32768 32x8192 \
    --variants nvfp4=mma fp8_e4m3=tok
done
ls "$OUT"
