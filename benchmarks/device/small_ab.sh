#!/bin/bash
# One device call: the engine's 1-request decode step (dummy Llama-3.1-8B, 3K tokens, CUDA graphs) under
# several decode settings, each in its own process, per-kernel profiled: where a small-batch step goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
E="python3 benchmarks/bench_engine.py --part long --synthetic-prefill --long-input 3072 --long-requests 1 --long-output 48 --profile-steps 3 --profile-top 12"
run() { name=$1; ev=$2; shift 2; mkdir -p "$OUT/$name"; env $ev $E "$@" --out "$OUT/$name" > "$OUT/$name/log" 2>&1
  python3 - "$OUT/$name/bench_engine.json" "$name" <<'PY' || tail -5 "$OUT/$name/log"
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    ks = {k["kernel"][:22]: k["ms_per_step"] for k in r["top_kernels"] if any(x in k["kernel"] for x in ("decode", "combine", "rope", "store"))}
    print(sys.argv[2], r["kv_dtype"], r["running_requests"], "step", r["step_ms"], "busy", r["gpu_busy_ms_per_step"], ks)
PY
}
RUNS=("fp8 X=1 --kv-dtypes fp8_e4m3" "mma X=1 --kv-dtypes nvfp4" "ppsm4 NIBBLEKV_DECODE_VARIANT=mma:ppsm=4 --kv-dtypes nvfp4"
      "ppsm8 NIBBLEKV_DECODE_VARIANT=mma:ppsm=8 --kv-dtypes nvfp4" "tin0 NIBBLEKV_DECODE_VARIANT=mma:tin=0 --kv-dtypes nvfp4")
for v in "${RUNS[@]}"; do
  run $v  # NOTE: unquoted: name, one env assignment, then the bench's own flags
done
