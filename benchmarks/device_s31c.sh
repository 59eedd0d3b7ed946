#!/bin/bash
# Stop 31, third H200 call (~8 min): (1) issue 4's long part in one run at this tree -- dummy Llama-3.1-8B,
# 32K in / 1024 out, every dtype, matched (the most bf16 holds) and capacity-driven, profiled;
# (2) nvfp4's decode step at 256 requests x ~600 tokens profiled (device_s31b.sh ran out of time before it).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_s31c.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 420 python3 benchmarks/bench_engine.py --out "$OUT/l" --part long --long-model llama-3.1-8b \
  --synthetic-prefill --long-input 32768 --long-output 1024 --profile-steps 4 > "$OUT/engine-h200.log" 2>&1
echo "long exit $?"; tail -9 "$OUT/engine-h200.log"
cp "$OUT"/l/bench_engine.json "$OUT/engine-h200.json" 2>/dev/null
cp "$OUT"/l/bench_engine.png "$OUT/engine-h200.png" 2>/dev/null; rm -rf "$OUT/l"
timeout -k 5 100 python3 benchmarks/bench_engine.py --out "$OUT/p" --part long --long-model llama-3.1-8b \
  --synthetic-prefill --long-input 600 --long-requests 256 --long-output 64 --profile-steps 4 \
  --kv-dtypes nvfp4 > "$OUT/engine-b256-ctx600-nvfp4-h200.log" 2>&1
echo "profile exit $?"; grep -o '"decode_tok_s[^]]*' "$OUT/engine-b256-ctx600-nvfp4-h200.log" | head -3
rm -rf "$OUT/p"
ls "$OUT"
