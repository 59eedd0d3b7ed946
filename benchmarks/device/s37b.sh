#!/bin/bash
# Stop 37, second call: the GPU tests of the kernels _page_addr touches (decode_mma, decode_balanced, extend
# through decode_mma/decode_mma16) and of the FP8 two-group extend, then FP8's 8-token extend chunks through
# two decode_tok groups (extend_decode(..., wide="tok"), opt-in) against extend_triton and the one-group plan
# (DEC=0: extend_triton; DEC=1: extend_decode's default plan; DEC=2: wide="tok", kernel extend_decode_tok).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s37b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/gpu-tests-s37-h200.log
timeout -k 5 ${T_TESTS:-330} python3 -m pytest -v -rfE tests/test_kernels_extend_decode.py \
  tests/test_kernels_decode_balanced.py tests/test_kernels_decode.py -k "mma or balanced or extend" \
  > "$LOG" 2>&1
echo "tests exit $? ($(grep -c PASSED "$LOG") passed)"; tail -3 "$LOG"
timeout -k 5 200 python3 benchmarks/bench_extend.py --out "$OUT" --shapes 64x8192x8 32x8192x16 64x8192x4 \
  --configs 0:0 0:0:0:0:0:0:0:1 0:0:0:0:0:0:0:2 > "$OUT/extend-fp8-groups-h200.log" 2>&1
echo "bench exit $?"; grep -v "^ *$" "$OUT/extend-fp8-groups-h200.log" | tail -24
mv "$OUT/extend-sweep.json" "$OUT/extend-fp8-groups-h200.json" 2>/dev/null
ls "$OUT"
