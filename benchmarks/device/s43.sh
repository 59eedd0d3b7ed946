#!/bin/bash
# Next stop's first call (written at stop 42): where the NVFP4 4-token extend chunk's 235 us go at this tree.
# 0.60 of the read ceiling needs <= ~222 us at B=64 x 8K (0.569 at b4efb17); the prefix decode
# (decode_mma16, 16 columns) is ~213 us of it, the rest is the own-chunk + merge extend launch (~12 us at
# stop 33), the combine (~4), the Q gather (~3) and a zeros fill (~1). Per-kernel GPU times (--breakdown)
# for 2 / 4 / 8-token chunks at 64 x 8K and 4-token chunks at 32 x 32K, extend_triton beside them; and the
# own-chunk launch (extend_decode's own_warps / own_block_n: configs WARPS and BN with DEC=1) at 1 / 2 warps
# and 16-key blocks instead of 4 warps and 64.
# Usage from the repo root: OUT=... bash benchmarks/device/s43.sh   (~2-3 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/extend"
timeout -k 5 "${T_EXT:-300}" python3 benchmarks/bench_extend.py --breakdown --configs 0:0 0:0:0:0:0:0:0:1 \
  0:0:1:0:16:0:0:1 0:0:2:0:16:0:0:1 0:0:4:0:16:0:0:1 0:0:1:0:0:0:0:1 \
  --shapes 64x8192x2 64x8192x4 64x8192x8 32x32768x4 --out "$OUT/extend" > "$OUT/extend/extend.log" 2>&1
echo "extend exit $?"; grep -E "^extend" "$OUT/extend/extend.log" | tail -30
