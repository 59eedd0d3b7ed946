#!/bin/bash
# Stop 29, one H200 call (~8 min): (1) GPU tests of decode_mma's lazy rescale (option lz: the running max
# stays while no score exceeds it by more than lz log2 units; _mma_ptx._lazy_step_ptx); (2) decode variants
# with the 64-token bf16 tail, GQA 4: NVFP4 mma vs mma:lz=8 / mma:tpi=1,lz=8, BF16 / FP8 tok vs tok:tr=1
# (the tail's program counted in the split budget); (3) FP8 head_dim 64: tok vs tok:wv=4.
# Usage from the repo root: OUT=... bash benchmarks/device/s29.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 150 python3 -m pytest -q -x tests/test_kernels_decode.py \
  -k "test_decode_mma_lazy or (test_decode_mma and lz)" \
  > "$OUT/gpu-tests-lz.log" 2>&1
rc=$?
echo "gpu tests exit $rc"; tail -3 "$OUT/gpu-tests-lz.log"
V="nvfp4=mma nvfp4=mma:lz=8 nvfp4=mma:tpi=1,lz=8 bf16=tok bf16=tok:tr=1 fp8_e4m3=tok fp8_e4m3=tok:tr=1"
[[ $rc == 0 ]] || V="bf16=tok bf16=tok:tr=1 fp8_e4m3=tok fp8_e4m3=tok:tr=1"
timeout -k 5 250 python3 benchmarks/bench_decode_variants.py --out "$OUT/a" --budget-s 200 --tail \
  --shapes 26x32768 8x32768 32x8192 64x32768 1x131072 --variants $V > "$OUT/decode-variants-lz-tr.log" 2>&1
echo "bench a exit $?"
cp "$OUT/a/decode-variants.json" "$OUT/decode-variants-lz-tr-h200.json" 2>/dev/null; rm -rf "$OUT/a"
tail -40 "$OUT/decode-variants-lz-tr.log" | grep -v "^$"
timeout -k 5 110 python3 benchmarks/bench_decode_variants.py --out "$OUT/b" --budget-s 80 --head-dim 64 \
  --shapes 8x32768 64x8192 32x8192 --variants fp8_e4m3=tok fp8_e4m3=tok:wv=4 \
  > "$OUT/decode-variants-d64-wv.log" 2>&1
echo "bench b exit $?"
cp "$OUT/b/decode-variants.json" "$OUT/decode-variants-d64-wv-h200.json" 2>/dev/null; rm -rf "$OUT/b"
tail -12 "$OUT/decode-variants-d64-wv.log" | grep -v "^$"
