#!/bin/bash
# One device call (~3 min): decode_mma launch options against the default, at GQA 4 and GQA 8 (per-kernel
# breakdown there). History: vst/vq (vector partial stores / Q loads) won on 2026-11-30 and are default
# (decode-variants-vst-h200.json). Now, untimed:
#  - cv=1/2/3: nibbles -> fp16 by integer ops for K / V / both instead of E4M3 bytes + cvt. The default
#    issues 140 conversions (F2FP) per 32 token-heads; at 0.72 of the ceiling that is ~0.43 F2FP per SM
#    clock, near a quarter-rate pipe's 0.5, so it may be the limit (sm_90 compile: cv=1 856 SASS per
#    iteration, F2FP 76; cv=3 936, F2FP 12; default 776, F2FP 140);
#  - ppsm=20,tpi=1: 20 one-warp programs per SM at 96 registers (24 B of spills) -- more warps to hide
#    latency.
# Usage on the GPU machine: bash benchmarks/device/decode_ab.sh; results in $OUT/gqa4, $OUT/gqa8.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/gqa4" "$OUT/gqa8"
V4=${AB_VARIANTS:-nvfp4=mma nvfp4=mma:cv=1 nvfp4=mma:cv=2 nvfp4=mma:cv=3 nvfp4=mma:ppsm=20,tpi=1 fp8_e4m3=tok}
V8=${AB_VARIANTS8:-nvfp4=mma nvfp4=mma:cv=1 nvfp4=mma:cv=3 fp8_e4m3=tok}
timeout 260 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa4" --budget-s 220 \
    --variants $V4 2>&1 | tee "$OUT/gqa4.log" | tail -14
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa8" --budget-s 150 --q-heads 64 --breakdown \
    --variants $V8 2>&1 | tee "$OUT/gqa8.log" | tail -24
