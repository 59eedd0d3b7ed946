#!/bin/bash
# Stop 39, last call: decode_mma at ppsm 12 (168 registers) vs 16 where a programs-per-SM rule would switch
# (GQA 4 B32x8K / B128x8K, GQA 8), and head_dim 64 at 8 programs per SM (248 registers). One call.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s39c.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} PYTHONPATH=.
OUT=${OUT:-/tmp/out}
run() {  # $1 = tag, rest = bench_decode_variants args
  local tag=$1; shift
  timeout -k 5 ${T_AB:-60} python3 benchmarks/bench_decode_variants.py --out "$OUT/$tag" "$@" \
    > "$OUT/$tag.log" 2>&1
  echo "== $tag exit $?"; grep -E "^ *nvfp4|^B|x[0-9]+ " "$OUT/$tag.log" | tail -8
}
mkdir -p "$OUT"
run ppsm-gqa4 --shapes 32x8192 128x8192 --variants nvfp4=mma nvfp4=mma:ppsm=12
run ppsm-gqa8 --q-heads 64 --shapes 32x8192 8x32768 --variants nvfp4=mma nvfp4=mma:ppsm=12
run ppsm-d64 --head-dim 64 --shapes 8x32768 --variants nvfp4=mma nvfp4=mma:ppsm=8
