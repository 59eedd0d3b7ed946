#!/bin/bash
# Stop 34: (1) what the L2 flush between timed calls costs the timed kernel (probe_flush.py: write / read /
# no flush, interleaved per shape), (2) the whole kernel benchmark with the read flush
# (kernels-h200.{json,log,png}). Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_s34.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 200 python3 benchmarks/probe_flush.py --out "$OUT" > "$OUT/probe-flush-h200.log" 2>&1
echo "probe exit $?"; sed -n '/^shape/,$p' "$OUT/probe-flush-h200.log"
mv "$OUT/probe-flush.json" "$OUT/probe-flush-h200.json" 2>/dev/null
timeout -k 5 300 python3 benchmarks/bench_kernels.py --out "$OUT" --flush read > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; tail -60 "$OUT/kernels-h200.log" | cut -c1-250
ls "$OUT"
