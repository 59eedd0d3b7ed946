#!/bin/bash
# One device call (~8 min, H200) for the changes of stop 18 that no GPU has run yet, and the A/Bs they
# need: GPU tests (RoPE rotation with split columns, the bf16 tail inside decode_mma's grid at head_dim 64
# and 128, the combine step's chunks), then decode variants side by side (the integer nibble conversion
# mma:cv, FP8 tok split caps at B=1 x 128K, GQA 8), then the engine's small-batch step with and without the
# overlap schedule. Logs and JSON land in $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q tests/test_kernels_fused.py tests/test_kernels_decode.py \
  -k "rotat or tail_in_grid or combine or head_dim_64 or (test_decode_mma and 4-16)" > "$OUT/tests.log" 2>&1
echo "pytest exit $?"; tail -3 "$OUT/tests.log"
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT" --budget-s 150 \
  --shapes 64x32768 8x32768 32x8192 1x131072 \
  --variants nvfp4=mma nvfp4=mma:cv=3 nvfp4=mma:cv=1 nvfp4=mma:cv=2 fp8_e4m3=tok fp8_e4m3=tok:cap=128 fp8_e4m3=tok:cap=256 \
  > "$OUT/variants.log" 2>&1
grep -v "^    B\|arn" "$OUT/variants.log" | tail -12
for ov in "" "--enable-overlap-schedule"; do
  d="$OUT/engine${ov:+-overlap}"; mkdir -p "$d"
  timeout 100 python3 benchmarks/bench_engine.py --out "$d" --part long --synthetic-prefill --long-input 3072 \
    --long-requests 1 4 --long-output 48 --kv-dtypes fp8_e4m3 nvfp4 $ov > "$d/log" 2>&1
  tail -6 "$d/log"
done
