#!/bin/bash
# One H200 call (~7 min) for the in-kernel split-K fix-up (variant option fuse=1, stop 22; interpreter-tested,
# compiled for sm_90 on CPU, never run on a GPU): the pair's last program merges the partials, no combine
# launch (5-7.5% of the decode time at B=8 x 32K / B=32 x 8K in decode-variants-vst-h200.json).
#   1) GPU tests of the fused kernels; 2) A/B at GQA 8 and GQA 4 and at head_dim 64 (GQA 4), with the
#   per-kernel breakdown.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/fuse.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/fuse-gqa8" "$OUT/fuse-gqa4"
timeout -k 5 120 python3 -m pytest -q tests/test_kernels_decode_fixup.py > "$OUT/tests-fuse.log" 2>&1
echo "pytest exit $?"; tail -2 "$OUT/tests-fuse.log"
for q in 64 32; do
  d="$OUT/fuse-gqa$((q / 8))"
  timeout -k 5 150 python3 benchmarks/bench_decode_variants.py --out "$d" --budget-s 130 --tail --breakdown \
    --q-heads $q --shapes 8x32768 32x8192 64x32768 1x131072 \
    --variants fp8_e4m3=tok fp8_e4m3=tok:fuse=1 nvfp4=mma nvfp4=mma:fuse=1 bf16=tok bf16=tok:fuse=1 \
    > "$d/log" 2>&1
  echo "gqa$((q / 8)) exit $?"; grep -v "arn" "$d/log" | tail -14
done
mkdir -p "$OUT/fuse-d64"
timeout -k 5 100 python3 benchmarks/bench_decode_variants.py --out "$OUT/fuse-d64" --budget-s 80 --tail --breakdown \
  --head-dim 64 --shapes 8x32768 64x8192 64x32768 \
  --variants nvfp4=mma nvfp4=mma:fuse=1 fp8_e4m3=tok fp8_e4m3=tok:fuse=1 > "$OUT/fuse-d64/log" 2>&1
echo "d64 exit $?"; grep -v "arn" "$OUT/fuse-d64/log" | tail -10
