#!/bin/bash
# Prepared in stop 31 (not yet run): short-context decode at large batches, where the engine's offline
# throughput runs (256 requests of ~600 tokens: FP8's attention read ~2.1 TB/s there, 1.95x its step floor,
# engine-b256-ctx600-h200.log; kernel benchmark B=128 x 1K: FP8 0.52-0.58, NVFP4 0.55-0.59, BF16 0.78).
# FP8 decode_tok's default build holds 216 registers (2 programs of 4 warps per SM) and each program sees ~10
# tiles, so the 5-stage pipeline's fill and the epilogue are most of a program's life; 32-token tiles
# compile to 146 registers (3 per SM, `benchmarks/sass_decode.py`). (1) variants at 256 x 640, 128 x 1K,
# 64 x 1K and the 26 x 32K control; (2) nvfp4's engine step at 256 x ~600 tokens profiled (170 s were too
# few for three dtypes in stop 31).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s32.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
run s32a 240 --tail --breakdown --shapes 256x640 128x1024 64x1024 26x32768 \
  --variants fp8_e4m3=tok fp8_e4m3=tok:bn=32 fp8_e4m3=tok:bn=32,s=3 nvfp4=mma nvfp4=mma:tpi=1 bf16=tok
engine b256-ctx600-nvfp4 200 --part long --long-model llama-3.1-8b --synthetic-prefill --long-input 600 \
  --long-requests 256 --long-output 64 --profile-steps 4 --kv-dtypes nvfp4
ls "$OUT"
