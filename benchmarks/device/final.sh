#!/bin/bash
# H200: (1) which Triton builds SmolLM2's first offline-throughput run compiles although the engine warmed up
# (bench_engine --throughput-repeats: first runs 1.5-3x slower than warm ones for every dtype, device/c1.sh);
# (2) issue 6's agentic sweep complete in one run (stop 26's first run passed its 440 s limit one row short).
# Usage from the repo root: OUT=... bash benchmarks/device/final.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 110 python3 benchmarks/bench_engine.py --out "$OUT/tput" --part throughput \
  --throughput-models smollm2-135m > "$OUT/compiles.log" 2>&1
echo "throughput exit $?"; grep '^{' "$OUT/compiles.log" | python3 -c '
import json, sys, collections
for line in sys.stdin:
    r = json.loads(line)
    names = collections.Counter(c.split("[")[0] for c in r["compiled"])
    print(r["kv_dtype"], r["seconds"], r["warmup_s"], r["compiles_in_runs"], dict(names))'
timeout -k 5 470 python3 benchmarks/bench_prefix.py --out "$OUT" --workloads agentic --kv-dtypes fp8_e4m3 nvfp4 bf16 \
  --top-only hicache+bf16 --repeats 3 --enable-overlap-schedule > "$OUT/prefix-h200.log" 2>&1
echo "prefix exit $?"; grep '^{' "$OUT/prefix-h200.log" | cut -c1-150
