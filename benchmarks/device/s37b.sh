#!/bin/bash
# Stop 37, second call: the whole kernel benchmark at the _page_addr tree (the acceptance run), the GPU tests
# of decode_balanced (which the A/B timed at B=64 but checked only per pair) and of the FP8 two-group extend,
# then FP8's 8-token extend chunks through two decode_tok groups (extend_decode(..., wide="tok"), opt-in)
# against extend_triton and the one-group plan (DEC=0: extend_triton; 1: the default plan; 2: wide="tok").
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/s37b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 ${T_KERNELS:-280} python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; tail -4 "$OUT/kernels-h200.log"
LOG=$OUT/gpu-tests-s37-h200.log
timeout -k 5 ${T_TESTS:-110} python3 -m pytest -v -rfE tests/test_kernels_decode_balanced.py \
  tests/test_kernels_extend_decode.py -k "balanced or fp8" > "$LOG" 2>&1
echo "tests exit $? ($(grep -c PASSED "$LOG") passed)"; tail -3 "$LOG"
timeout -k 5 ${T_EXT:-110} python3 benchmarks/bench_extend.py --out "$OUT" --shapes 64x8192x8 32x8192x16 \
  --configs 0:0 0:0:0:0:0:0:0:1 0:0:0:0:0:0:0:2 > "$OUT/extend-fp8-groups-h200.log" 2>&1
echo "bench exit $?"; grep -v "^ *$" "$OUT/extend-fp8-groups-h200.log" | tail -16
mv "$OUT/extend-sweep.json" "$OUT/extend-fp8-groups-h200.json" 2>/dev/null
ls "$OUT"
