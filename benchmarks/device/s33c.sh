#!/bin/bash
# Stop 33, last call: extend_decode with the new gather and own-key launch -- (0) its GPU tests, (1) the
# extend rows with per-kernel GPU times, (2) the whole kernel benchmark (kernels-h200.{json,log,png}).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s33c.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
gpu_tests s33c 90 tests/test_kernels_extend_decode.py || exit 1
timeout -k 5 100 python3 benchmarks/bench_extend.py --out "$OUT/x" --breakdown --configs 0:0:0:0:0:0:0:1 \
  --shapes 64x8192x2 64x8192x4 64x8192x8 32x32768x1 > "$OUT/extend-breakdown-s33c-h200.log" 2>&1
echo "extend exit $?"; cp "$OUT/x/extend-sweep.json" "$OUT/extend-breakdown-s33c-h200.json"; rm -rf "$OUT/x"
grep -E "^extend" "$OUT/extend-breakdown-s33c-h200.log" | cut -c1-300
timeout -k 5 280 python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; grep -E "extend" "$OUT/kernels-h200.log" | head -30; tail -3 "$OUT/kernels-h200.log"
ls "$OUT"
