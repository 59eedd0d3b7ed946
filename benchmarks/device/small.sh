#!/bin/bash
# One device call (stop 18): decode_mma with the bf16 tail inside its grid (variant option tin) -- GPU tests,
# registers/spills, kernel times at small and large shapes against the side-stream tail and FP8, then the
# engine's small-batch steps (dummy Llama-3.1-8B, 1 and 4 requests x 3K tokens). Logs land in $OUT.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q tests/test_kernels_decode.py -k "tail_in_grid or empty_splits or no_tail or (test_decode_mma and 4-16)" tests/test_kernels_sass.py \
  > "$OUT/tests.log" 2>&1
echo "pytest exit $?"; tail -4 "$OUT/tests.log"
timeout 200 python3 benchmarks/bench_decode_variants.py --out "$OUT" --tail --breakdown --budget-s 150 \
  --shapes 1x3072 4x3072 12x3072 8x32768 64x32768 1x131072 \
  --variants nvfp4=mma nvfp4=mma:tin=0 fp8_e4m3=tok > "$OUT/variants.log" 2>&1
grep -v "^    B\|Warn\|warn" "$OUT/variants.log" | tail -14
timeout 200 python3 benchmarks/bench_engine.py --out "$OUT" --part long --synthetic-prefill --long-input 3072 \
  --long-requests 1 4 --long-output 48 --kv-dtypes fp8_e4m3 nvfp4 --profile-steps 3 --profile-top 16 \
  > "$OUT/engine.log" 2>&1
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ.get("OUT", "/tmp/out"), "bench_engine.json")))
for r in d["rows"]:
    ks = {k["kernel"][:22]: k["ms_per_step"] for k in r["top_kernels"] if any(x in k["kernel"] for x in ("decode", "combine", "rope", "store"))}
    print(r["kv_dtype"], r["running_requests"], "step", r["step_ms"], "busy", r["gpu_busy_ms_per_step"], ks)
PY
