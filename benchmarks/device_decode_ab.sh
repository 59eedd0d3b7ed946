#!/bin/bash
# One device call (~3 min): decode_mma launch options against the default, at GQA 4 and GQA 8 (per-kernel
# breakdown there). History: vst/vq (vector partial stores / Q loads) won on 2026-11-30 and are default
# (decode-variants-vst-h200.json). Now: 20 one-warp programs per SM at 96 registers with one tile per
# iteration (ppsm=20,tpi=1; sm_90 compile on CPU: 24 B of spills, 28.4 warp-instructions per token-head
# vs 24.3 at the default's 16 x 128 registers) -- more warps to hide latency, or not.
# Usage on the GPU machine: bash benchmarks/device_decode_ab.sh; results in $OUT/gqa4, $OUT/gqa8.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/gqa4" "$OUT/gqa8"
V=${AB_VARIANTS:-nvfp4=mma nvfp4=mma:ppsm=20,tpi=1 nvfp4=mma:ppsm=20,tpi=1,pf=0 fp8_e4m3=tok}
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa4" --budget-s 150 \
    --variants $V 2>&1 | tee "$OUT/gqa4.log" | tail -12
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa8" --budget-s 150 --q-heads 64 --breakdown \
    --variants $V 2>&1 | tee "$OUT/gqa8.log" | tail -24
