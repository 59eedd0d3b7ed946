#!/bin/bash
# Stop 40, first call: the full kernel benchmark at HEAD (the token-balanced kernel at 12 programs per SM in a
# full run for the first time), the engine at matched concurrency (26 x 32K, fp8 vs nvfp4), then two A/Bs:
# the balanced kernel at the engine's 208 pairs (with the bf16 tail) and head_dim 64 B8x32K's step options.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s40.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} PYTHONPATH=.
OUT=${OUT:-/tmp/out}
T_KERNELS=${T_KERNELS:-280} T_ENGINE=${T_ENGINE:-150} OUT=$OUT bash benchmarks/device/s39b.sh
run() {  # $1 = tag, rest = bench_decode_variants args
  local tag=$1; shift
  timeout -k 5 ${T_AB:-60} python3 benchmarks/bench_decode_variants.py --out "$OUT/$tag" "$@" \
    > "$OUT/$tag.log" 2>&1
  echo "== $tag exit $?"; grep -E "^ *nvfp4|^B|x[0-9]+ " "$OUT/$tag.log" | tail -8
}
run bal208 --tail --shapes 26x32768 --variants nvfp4=mma nvfp4=mma:bal=1 nvfp4=mma:bal=1,bppsm=16
run d64 --head-dim 64 --shapes 8x32768 --variants nvfp4=mma nvfp4=mma:tpi=1 nvfp4=mma:pf=0 nvfp4=mma:minc=128
