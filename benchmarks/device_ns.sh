#!/bin/bash
# decode_mma with its tile loop pipelined by cp.async (variant option ns, stop 25): GPU tests of the new
# builds, then an A/B against the register-prefetch default at the shapes issue 3 misses, GQA 4 and 8.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_ns.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T=tests/test_kernels_decode.py::test_decode_mma
timeout -k 5 200 python3 -m pytest -q "$T[mma:ns=3-4-16]" "$T[mma:ns=3-8-5]" "$T[mma:ns=3,w=2-3-16]" \
  "$T[mma:ns=4,tpi=1-1-5]" "$T[mma:ns=3,ws=0-4-16]" "$T[mma:ws=1-8-16]" > "$OUT/tests-ns.log" 2>&1
echo "tests exit $?"; tail -3 "$OUT/tests-ns.log"
timeout -k 5 120 python3 -m pytest -q tests/test_kernels_decode_balanced.py -k pipelined > "$OUT/tests-ns-bal.log" 2>&1
echo "balanced tests exit $?"; tail -3 "$OUT/tests-ns-bal.log"
timeout -k 5 200 python3 benchmarks/bench_decode_variants.py --out "$OUT/ns-gqa4" --budget-s 170 --tail \
  --shapes 26x32768 8x32768 32x8192 1x131072 64x32768 \
  --variants nvfp4=mma nvfp4=mma:ns=3 nvfp4=mma:ns=4,ppsm=12 nvfp4=mma:ns=4,tpi=1 nvfp4=mma:ns=6,tpi=1 \
  nvfp4=mma:tpi=1,pf=0,ppsm=20 > "$OUT/ns-gqa4.log" 2>&1
echo "gqa4 exit $?"; grep -v "arn" "$OUT/ns-gqa4.log" | tail -16
timeout -k 5 130 python3 benchmarks/bench_decode_variants.py --out "$OUT/ns-gqa8" --budget-s 100 --tail --q-heads 64 \
  --shapes 8x32768 32x8192 128x8192 1x131072 \
  --variants nvfp4=mma nvfp4=mma:ns=3 nvfp4=mma:ns=4,tpi=1 > "$OUT/ns-gqa8.log" 2>&1
echo "gqa8 exit $?"; grep -v "arn" "$OUT/ns-gqa8.log" | tail -12
