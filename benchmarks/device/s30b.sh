#!/bin/bash
# Stop 30, second H200 call (~6 min): BF16 / FP8 decode_tok launch configs (after device/s30.sh: BF16 s=5 read
# .889 vs .842 at B8x32K with the tail; head_dim 64 BF16 bn=128 .834 and wv=4,s=5 .843, FP8 .728 at B8x32K).
#   (a) head_dim 128, no tail, GQA 4 and GQA 8: BF16 tok (5 stages now) vs s=4 / s=6, FP8 tok beside them.
#   (b) head_dim 64, no tail: BF16 bn=128 with one-wave splits, FP8 tiles / stages / one-wave programs.
#   (c) the balanced combine in one pass: its GPU tests, then NVFP4 mma (balanced from 256 pairs) vs bal=0
#       with per-kernel times (benchmarks/device/s30.sh's s30a has the three-trip combine at the same shapes).
# Usage from the repo root: OUT=... bash benchmarks/device/s30b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
timeout -k 5 100 python3 -m pytest -q -x tests/test_kernels_decode_balanced.py > "$OUT/gpu-tests-bal-combine.log" 2>&1
echo "gpu tests exit $?"; tail -1 "$OUT/gpu-tests-bal-combine.log"
run s30g 110 --tail --breakdown --shapes 32x8192 64x8192 128x8192 --variants nvfp4=mma nvfp4=mma:bal=0
SH="64x32768 8x32768 32x8192 128x8192 1x131072"
run s30d 100 --shapes $SH --variants bf16=tok:s=4 bf16=tok bf16=tok:s=6 fp8_e4m3=tok
run s30e 90 --q-heads 64 --shapes $SH --variants bf16=tok:s=4 bf16=tok fp8_e4m3=tok
run s30f 170 --head-dim 64 --shapes 8x32768 64x8192 64x32768 32x8192 --variants \
  bf16=tok bf16=tok:bn=128,s=4 bf16=tok:bn=128,wv=2,s=4 bf16=tok:bn=128,wv=3,s=4 bf16=tok:bn=128,wv=2 bf16=tok:wv=4 \
  bf16=tok:bn=32,wv=8,s=6 fp8_e4m3=tok fp8_e4m3=tok:bn=256 fp8_e4m3=tok:bn=256,wv=2 fp8_e4m3=tok:wv=3 \
  fp8_e4m3=tok:wv=6 fp8_e4m3=tok:w=8,wv=2 fp8_e4m3=tok:s=4
