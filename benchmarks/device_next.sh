#!/bin/bash
# H200 calls for what stop 26 left unmeasured (~15 min in all: STEPS="1 2" then STEPS="3"). $OUT gets logs/JSON
# (NOTE: a call brings back at most 8 files: each step merges its rows into one JSON and drops the rest).
#   1) Issue 6's one-session gap: one 8B request at 2.7K context (the agentic sweep's c=1 regime), nvfp4 decode
#      profiled with the tail program's page-id prefetch (tpp=1, c9032d5: tail loop 408 -> 361 SASS) and the
#      one-pass combine (co=1, f14a755) against the default, fp8 beside them (stop 26: decode kernel 10.2 vs
#      7.9 us a layer, 2.7 of it the tail; combine 3.1 vs 1.9). First the GPU tests of those options.
#   2) The Triton builds SmolLM2's first offline-throughput run compiles after the warm-up, now with each
#      build's argument attributes (which pointer lost its 16-byte alignment / which int its 16-divisibility),
#      every dtype; the workload timed twice (first vs warm run).
#   3) If tpp=1 / co=1 win in 1): the agentic sweep with them (V="mma:tpp=1,co=1", about 470 s).
# Usage from the repo root: OUT=... COMMIT=<sha> STEPS="1 2" bash benchmarks/device_next.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
STEPS=" ${STEPS:-1 2} "
mkdir -p "$OUT"
merge() {  # merge() NAME DIR...: the rows of DIR/bench_engine.json -> $OUT/NAME.json, then remove the DIRs
  python3 - "$@" <<'PY'
import glob, json, os, shutil, sys
name, dirs = sys.argv[1], sys.argv[2:]
rows = []
for d in dirs:
    for f in glob.glob(os.path.join(d, "bench_engine*.json")):
        for r in json.load(open(f))["rows"]:
            r["run"] = os.path.basename(d)
            rows.append({k: v for k, v in r.items() if k != "steps"})
    shutil.rmtree(d, ignore_errors=True)
out = os.path.join(os.environ.get("OUT", "/tmp/out"), name + ".json")
json.dump({"commit": os.environ.get("COMMIT"), "rows": rows}, open(out, "w"), indent=1)
for r in rows:
    k = {x["kernel"]: x["ms_per_step"] for x in r.get("top_kernels", [])}
    print(r["run"], r["kv_dtype"], r.get("step_ms"), r.get("gpu_busy_ms_per_step"),
          k.get("decode_mma_kernel") or k.get("decode_tok_kernel"), r.get("seconds_runs"), r.get("compiles_in_runs"))
PY
}
if [[ $STEPS == *" 1 "* ]]; then
  timeout -k 5 150 python3 -m pytest -q -x tests/test_kernels_decode.py -k "mma and (tpp or co)" \
    > "$OUT/gpu-tests-options.log" 2>&1
  echo "gpu tests exit $?"; tail -2 "$OUT/gpu-tests-options.log"
  dirs=()
  for v in fp8 mma mma:tpp=1 mma:co=1 mma:tpp=1,co=1 mma; do
    tag=c1-${v//[:=,]/_}-${#dirs[@]}; dt=nvfp4; [[ $v == fp8 ]] && dt=fp8_e4m3
    NIBBLEKV_DECODE_VARIANT=${v/fp8/} timeout -k 5 75 python3 benchmarks/bench_engine.py --out "$OUT/$tag" --part long \
      --long-model llama-3.1-8b --synthetic-prefill --long-input 2700 --long-requests 1 --long-output 48 \
      --profile-steps 4 --profile-top 8 --kv-dtypes $dt > "$OUT/$tag.log" 2>&1
    echo "$v exit $?"; dirs+=("$OUT/$tag"); rm -f "$OUT/$tag.log"
  done
  merge engine-c1-tpp "${dirs[@]}"
fi
if [[ $STEPS == *" 2 "* ]]; then
  timeout -k 5 200 python3 benchmarks/bench_engine.py --out "$OUT/tput" --part throughput \
    --throughput-models smollm2-135m --throughput-repeats 2 > "$OUT/compiles.log" 2>&1
  echo "throughput exit $?"; merge engine-throughput-smollm2-compiles "$OUT/tput"
fi
if [[ $STEPS == *" 3 "* ]]; then
  NIBBLEKV_DECODE_VARIANT=${V:-mma:tpp=1,co=1} timeout -k 5 480 python3 benchmarks/bench_prefix.py --out "$OUT" \
    --workloads agentic --kv-dtypes fp8_e4m3 nvfp4 bf16 --top-only hicache+bf16 --repeats 3 \
    --enable-overlap-schedule > "$OUT/prefix-h200.log" 2>&1
  echo "prefix exit $?"; grep '^{' "$OUT/prefix-h200.log" | cut -c1-150
fi
