#!/bin/bash
# Stop 38: the pool's NVFP4 words in sm order (decode_mma: 6 masks + 5 IMAD shifts a word) against the tree
# before (f3bc8c2: standard order, E4M3 bytes + cvt.rn.f16x2.e4m3x2), one machine, one call, two processes a
# tree, alternating old/new per head shape. Each bench_decode_variants run checks the kernel against its own
# tree's decode_ref on the GPU before it times it.
# Usage from the repo root, with the old tree unpacked as an untracked folder first:
#   mkdir -p ab_old && git archive f3bc8c2 nibblekv | tar -x -C ab_old
#   OUT=... COMMIT=<sha> bash benchmarks/device/s38b.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export T_AB=${T_AB:-60}
# shellcheck source=benchmarks/device/ab_lib.sh
source benchmarks/device/ab_lib.sh
for i in 1 2; do
  ab_run sm-gqa4-h200 old --variants nvfp4=mma --shapes 8x32768 26x32768 64x32768 32x8192 1x131072 128x8192
  ab_run sm-gqa4-h200 new --variants nvfp4=mma --shapes 8x32768 26x32768 64x32768 32x8192 1x131072 128x8192
done
ab_run sm-d64-h200 old --variants nvfp4=mma --head-dim 64 --shapes 8x32768 64x8192 64x32768
ab_run sm-d64-h200 new --variants nvfp4=mma --head-dim 64 --shapes 8x32768 64x8192 64x32768
ab_run sm-gqa8-h200 old --variants nvfp4=mma --q-heads 64 --shapes 8x32768 32x8192 64x32768
ab_run sm-gqa8-h200 new --variants nvfp4=mma --q-heads 64 --shapes 8x32768 32x8192 64x32768
ab_summary "$OUT/sm-*.json"
ls "$OUT"
