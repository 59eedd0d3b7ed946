#!/bin/bash
# One H200 call (~6 min): the small-batch nvfp4-vs-fp8 engine A/B (benchmarks/bench_small_ab.py), then the
# whole kernel benchmark (issue 3's kernels-h200.json in one run).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/ab_kernels.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/kernels"
timeout -k 5 240 python3 benchmarks/bench_small_ab.py --out "$OUT" > "$OUT/small-ab.log" 2>&1
echo "small-ab exit $?"; grep -v "^{\|arn" "$OUT/small-ab.log" | tail -26
timeout -k 5 280 python3 benchmarks/bench_kernels.py --out "$OUT/kernels" > "$OUT/kernels/kernels-h200.log" 2>&1
echo "kernels exit $?"; tail -4 "$OUT/kernels/kernels-h200.log"
