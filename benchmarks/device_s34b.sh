#!/bin/bash
# Stop 34, second call: the flush probe again with two shapes that fit in L2 (does the read flush empty it?)
# and the whole kernel benchmark again with the read flush (its spread: the first run read BF16 head_dim 64
# 8 x 32K at 147 us against the probe's 132 in the same session).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_s34b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 200 python3 benchmarks/probe_flush.py --out "$OUT" > "$OUT/probe-flush-b-h200.log" 2>&1
echo "probe exit $?"; sed -n '/^shape/,$p' "$OUT/probe-flush-b-h200.log"
mv "$OUT/probe-flush.json" "$OUT/probe-flush-b-h200.json" 2>/dev/null
timeout -k 5 300 python3 benchmarks/bench_kernels.py --out "$OUT" --flush read > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; grep -E "^decode +(bf16|fp8_e4m3|nvfp4) +(8 +32768|64 +8192) +32 +64" "$OUT/kernels-h200.log"
ls "$OUT"
