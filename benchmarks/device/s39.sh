#!/bin/bash
# Stop 39: decode_mma's register budget. At ppsm=16 (128 registers) ptxas sinks the next tile's loads to the
# loop's last ~90 of ~780 SASS and moves one 64-bit value through local memory; at ppsm=14 (144) / 12 (168)
# it issues them ~200 / ~300 SASS before the end, with no spill at head_dim 64. Variants side by side, one
# call: head_dim 64 (plus the tree before the sm order, f3bc8c2, for the regression), GQA 4 and GQA 8 at
# head_dim 128.
# Usage from the repo root, with the old tree unpacked as an untracked folder first:
#   mkdir -p ab_old && git archive f3bc8c2 nibblekv | tar -x -C ab_old
#   OUT=... COMMIT=<sha> bash benchmarks/device/s39.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export T_AB=${T_AB:-100}
# shellcheck source=benchmarks/device/ab_lib.sh
source benchmarks/device/ab_lib.sh
D64="--head-dim 64 --shapes 8x32768 64x8192 64x32768"
V="nvfp4=mma nvfp4=mma:ppsm=14 nvfp4=mma:ppsm=12"
ab_run regs-d64-h200 new $D64 --variants $V nvfp4=mma:pf=0
ab_run regs-d64-h200 old $D64 --variants nvfp4=mma
ab_run regs-gqa4-h200 new --shapes 8x32768 26x32768 64x32768 32x8192 1x131072 --variants $V
ab_run regs-gqa8-h200 new --q-heads 64 --shapes 8x32768 32x8192 64x32768 \
  --variants nvfp4=mma nvfp4=mma:ppsm=14
ab_run regs-d64-h200 new $D64 --variants nvfp4=mma:ppsm=12 nvfp4=mma:ppsm=14 nvfp4=mma
ab_summary "$OUT/regs-*.json"
