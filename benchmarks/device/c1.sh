#!/bin/bash
# H200 A/B for issue 6's one-session gap (nvfp4 decode steps ~0.1 ms slower than fp8's at B=1 x 2.7K, the
# agentic sweep's c=1 regime) and the SmolLM2 offline-throughput question (first run vs warm run).
#   1) SmolLM2 offline throughput, every dtype, the workload timed twice on one engine.
#   2) One 8B request at 2.7K context, nvfp4 decode profiled under decode variants (tail first, minc).
# Usage from the repo root: OUT=... bash benchmarks/device/c1.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 170 python3 benchmarks/bench_engine.py --out "$OUT/tput" --part throughput \
  --throughput-models smollm2-135m --throughput-repeats 2 > "$OUT/tput.log" 2>&1
echo "throughput exit $?"; grep '^{' "$OUT/tput.log" | cut -c1-400
# (stop 26 also ran mma:tf=1 and mma:tf=1,minc=128 at 25ef15f: no change; that option is removed since)
for v in mma mma:minc=128; do
  tag=${v//[:=,]/_}
  NIBBLEKV_DECODE_VARIANT=$v timeout -k 5 75 python3 benchmarks/bench_engine.py --out "$OUT/c1-$tag" --part long \
    --long-model llama-3.1-8b --synthetic-prefill --long-input 2700 --long-requests 1 --long-output 48 \
    --profile-steps 4 --profile-top 8 --kv-dtypes nvfp4 > "$OUT/c1-$tag.log" 2>&1
  echo "$v exit $?"; python3 - "$OUT/c1-$tag/bench_engine.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["rows"][0]
k = {x["kernel"]: x["ms_per_step"] for x in r["top_kernels"]}
print(r["step_ms"], r["gpu_busy_ms_per_step"], k.get("decode_mma_kernel"), k.get("_combine_kernel"))
PY
done
