#!/bin/bash
# Stop 33, one call: (0) extend_decode's and extend's GPU tests (the merge now in extend_triton's epilogue);
# (1) extend rows at 2 / 4 / 8-token chunks over 8K prefixes (B=64, GQA 4) with per-kernel GPU times
# (gather, decode, combine, extend_triton with the merge); (2) decode with each request's pages in sequence
# vs at random places (64 x 128K, where NVFP4's fraction falls, and three smaller shapes); (3) the engine at a
# GQA-16 shape (4 of Llama-3.1-405B's layers), decode through decode_mma16 in CUDA graphs.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s33.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
gpu_tests s33 100 tests/test_kernels_extend_decode.py tests/test_kernels_extend.py || exit 1
timeout -k 5 110 python3 benchmarks/bench_extend.py --out "$OUT/x" --breakdown --configs 0:0 0:0:0:0:0:0:0:1 \
  --shapes 64x8192x2 64x8192x4 64x8192x8 > "$OUT/extend-breakdown-s33-h200.log" 2>&1
echo "extend exit $?"; cp "$OUT/x/extend-sweep.json" "$OUT/extend-breakdown-s33-h200.json"; rm -rf "$OUT/x"
grep -E "^extend" "$OUT/extend-breakdown-s33-h200.log" | cut -c1-400
for order in random sequential; do
  run "s33-$order" 100 --page-order $order --shapes 8x131072 64x131072 32x8192 \
    --variants nvfp4=mma fp8_e4m3=tok
done
engine gqa16 150 --part long --long-model llama-3.1-405b \
  --json-model-override-args '{"num_hidden_layers": 4}' \
  --kv-dtypes fp8_e4m3 nvfp4 --long-requests 32 --long-output 64 --synthetic-prefill --profile-steps 4
ls "$OUT"
