#!/bin/bash
# One device call (~3 min): decode_mma's opt-in epilogue/prologue options against the default, at GQA 4
# and GQA 8 (with a per-kernel breakdown there: where does GQA 8's ~15 us over GQA 4 go?).
#   vst=1: partial outputs as 16-byte vector stores; vq=1: Q as 16-byte vector loads (2026-11-30, untimed)
# Usage on the GPU machine: bash benchmarks/device_decode_ab.sh; results in $OUT/gqa4, $OUT/gqa8.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/gqa4" "$OUT/gqa8"
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa4" --budget-s 150 \
    --variants nvfp4=mma nvfp4=mma:vst=1 nvfp4=mma:vq=1 nvfp4=mma:vst=1,vq=1 fp8_e4m3=tok 2>&1 | tee "$OUT/gqa4.log" | tail -12
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/gqa8" --budget-s 150 --q-heads 64 --breakdown \
    --variants nvfp4=mma nvfp4=mma:vst=1,vq=1 fp8_e4m3=tok 2>&1 | tee "$OUT/gqa8.log" | tail -24
