#!/bin/bash
# Next stop's first call (written at stop 36, not run yet): time FP8's 8-token extend chunks through two
# decode_tok groups (extend_decode(..., wide="tok"), opt-in) against extend_triton and the one-group path,
# after their GPU test; then the rest of the GPU tests stop 36's call did not reach (test_kernels_decode.py
# from its decode_mma cases on).
#   DEC=0: extend_triton; DEC=1: extend_decode's default plan; DEC=2: wide="tok" (kernel extend_decode_tok)
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s37_extend.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 90 python3 -m pytest -q -x tests/test_kernels_extend_decode.py -k "fp8" > "$OUT/gpu-tests-fp8-groups.log" 2>&1
echo "fp8 extend tests exit $?"; tail -1 "$OUT/gpu-tests-fp8-groups.log"
timeout -k 5 200 python3 benchmarks/bench_extend.py --out "$OUT" --shapes 64x8192x8 32x8192x16 64x8192x4 \
  --configs 0:0 0:0:0:0:0:0:0:1 0:0:0:0:0:0:0:2 > "$OUT/extend-fp8-groups-h200.log" 2>&1
echo "bench exit $?"; grep -v "^ *$" "$OUT/extend-fp8-groups-h200.log" | tail -24
mv "$OUT/extend-sweep.json" "$OUT/extend-fp8-groups-h200.json" 2>/dev/null
timeout -k 5 ${T_TESTS:-250} python3 -m pytest -q -rfE tests/test_kernels_decode.py -k "mma and not combine" \
  > "$OUT/gpu-tests-decode-mma.log" 2>&1
echo "decode_mma tests exit $?"; tail -2 "$OUT/gpu-tests-decode-mma.log"
