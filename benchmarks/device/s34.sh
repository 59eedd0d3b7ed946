#!/bin/bash
# Stop 34: (1) what the L2 flush between timed calls costs the timed kernel (probe_flush.py: write / read /
# no flush, interleaved per shape) -> probe-flush[-TAG]-h200.*, (2) the whole kernel benchmark with the read
# flush (kernels-h200.{json,log,png}). Run twice: 9a418ab (TAG empty) and add5d05 (TAG=b: the probe with two
# shapes that fit in L2, and the full run again for its spread).
# Usage from the repo root: OUT=... COMMIT=<sha> [TAG=b] bash benchmarks/device/s34.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
NAME=probe-flush${TAG:+-$TAG}-h200
mkdir -p "$OUT"
timeout -k 5 200 python3 benchmarks/probe_flush.py --out "$OUT" > "$OUT/$NAME.log" 2>&1
echo "probe exit $?"; sed -n '/^shape/,$p' "$OUT/$NAME.log"
mv "$OUT/probe-flush.json" "$OUT/$NAME.json" 2>/dev/null
timeout -k 5 300 python3 benchmarks/bench_kernels.py --out "$OUT" --flush read > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"
grep -E "^decode +(bf16|fp8_e4m3|nvfp4) +(8 +32768|64 +8192) +32 +64" "$OUT/kernels-h200.log"
ls "$OUT"
