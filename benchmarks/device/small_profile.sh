#!/bin/bash
# One H200 call (~8 min): GPU tests of the stop-20 changes, then where a small-batch decode step goes.
#   1) decode_mma's run-time split-K for a padded CUDA-graph batch (`active`), the in-graph tail demotion
#      (graph decode == eager decode, nvfp4), the overlap schedule.
#   2) The engine's decode step at 1 / 2 requests x 3K tokens (dummy Llama-3.1-8B, CUDA graphs, overlap), each
#      kernel's GPU time per step, fp8_e4m3 vs nvfp4: the agentic sweep's 2-session tie (issue 6).
#   3) The decode kernel alone (decode + combine, --breakdown) at few (request, KV head) pairs.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/small_profile.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 150 python3 -m pytest -q tests/test_kernels_decode.py tests/test_engine_gpu.py \
  -k "active_rows or decode_equals_eager or overlap_schedule_equals_sync" > "$OUT/tests.log" 2>&1
echo "pytest exit $?"; tail -3 "$OUT/tests.log"
timeout -k 5 170 python3 benchmarks/bench_engine.py --out "$OUT/small" --part long --synthetic-prefill \
  --long-input 3072 --long-requests 1 2 --long-output 48 --kv-dtypes fp8_e4m3 nvfp4 --profile-steps 3 \
  --profile-top 40 > "$OUT/small.log" 2>&1
echo "small exit $?"
python3 - "$OUT/small/bench_engine.json" <<'PY' || tail -5 "$OUT/small.log"
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["kv_dtype"], r["running_requests"], "step", r["step_ms"], "floor", r["step_floor_ms"], "busy", r.get("gpu_busy_ms_per_step"))
    for k in r["top_kernels"]:
        print("   %8.4f ms  %5s  %s" % (k["ms_per_step"], k.get("calls_per_step", ""), k["kernel"][:70]))
PY
timeout -k 5 170 python3 benchmarks/bench_decode_variants.py --out "$OUT/variants" --budget-s 140 --tail --breakdown \
  --shapes 1x3072 2x3072 5x32768 10x32768 24x32768 \
  --variants nvfp4=mma nvfp4=mma:tw=1 nvfp4=mma:ppsm=8 fp8_e4m3=tok > "$OUT/variants.log" 2>&1
echo "variants exit $?"; grep -v "arn" "$OUT/variants.log" | tail -30
