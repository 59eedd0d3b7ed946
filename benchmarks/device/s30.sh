#!/bin/bash
# Stop 30, one H200 call (~9 min), all A/B on bench_decode_variants (each variant checked against the
# reference first; --breakdown: per-kernel GPU times, decode vs combine):
#   (a) GQA 4 with the bf16 tail, the engine's 26 x 32K and the rows below target: NVFP4 mma vs the TMA ring with
#       the lazy rescale (the ring holds the prefetch in shared memory, so lz no longer spills), per-pair vs
#       balanced splits; BF16 tok with more stages in flight (s=5, 6) and tr=1.
#   (b) head_dim 64, no tail (the kernel benchmark's head_dim-64 rows): BF16 / FP8 tok stages, tile sizes and
#       one-wave splits; NVFP4 mma.
#   (c) GQA 8 with the tail: NVFP4 mma vs tma + lz.
# Usage from the repo root: OUT=... bash benchmarks/device/s30.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
run s30a 230 --breakdown --tail --shapes 26x32768 8x32768 32x8192 64x8192 1x131072 --variants \
  nvfp4=mma nvfp4=mma:tma=3,lz=8 nvfp4=mma:tma=4,lz=8 nvfp4=mma:tma=3 nvfp4=mma:bal=0 nvfp4=mma:bal=1 \
  bf16=tok bf16=tok:s=5 bf16=tok:s=6 bf16=tok:s=5,tr=1
run s30b 170 --breakdown --head-dim 64 --shapes 8x32768 64x8192 64x32768 --variants \
  bf16=tok bf16=tok:s=5 bf16=tok:s=6 bf16=tok:bn=128 bf16=tok:bn=128,s=5 bf16=tok:wv=4 bf16=tok:wv=4,s=5 \
  bf16=tok:wv=4,s=6 fp8_e4m3=tok fp8_e4m3=tok:s=6 fp8_e4m3=tok:bn=64,s=6 nvfp4=mma nvfp4=mma:pf=0,lz=8
run s30c 130 --breakdown --tail --q-heads 64 --shapes 8x32768 32x8192 64x8192 --variants \
  nvfp4=mma nvfp4=mma:tma=3,lz=8 nvfp4=mma:tma=4,lz=8 nvfp4=mma:tma=3
