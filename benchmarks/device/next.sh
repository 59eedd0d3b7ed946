#!/bin/bash
# H200 calls for stop 27 (~15 min in all: STEPS="1" then STEPS="3"). $OUT gets logs/JSON
# (NOTE: a call brings back at most 8 files: each step merges its rows into one JSON and drops the rest).
#   1) Issue 6's one-session gap: one 8B request at 2.7K context (the agentic sweep's c=1 regime), nvfp4 decode
#      profiled with the bf16 tail shared by 2 / 4 one-warp programs (ts=2 / ts=4) against the default (now
#      tpp=1, co=1: engine-c1-tpp-h200.json), fp8 beside them, each twice in alternating order
#      (C1_VARIANTS overrides the list). First the GPU tests of the tail and combine options.
#   2) The Triton builds SmolLM2's first offline-throughput run compiles after the warm-up, now with each
#      build's argument attributes (which pointer lost its 16-byte alignment / which int its 16-divisibility),
#      every dtype; the workload timed twice (first vs warm run).
#   3) The agentic sweep with the default decode variant or V (e.g. V="mma:ts=4"), ~250-320 s.
#   4) The short check (~220 s): GPU tests of the cache write (K and V in programs of their own) and the
#      combine's early loads, then the agentic sweep's 1 and 2 sessions only (fp8 / nvfp4, no host tier).
# Stop 28 ran the whole kernel benchmark instead (kernels-h200.json, c2e7624) and benchmarks/device/tma.sh
# (tma / pdl: no gain). For stop 29: (a) BF16 / FP8 decode_tok with the bf16 tail: the tail program is one more
# program per pair, which can tip the grid into one more wave (BF16 B8x32K 0.90 -> 0.846 with the tail) --
# A/B splits that leave it room; (b) FP8 head_dim 64 one-wave splits (wv=4?); (c) the engine's matched 32K and
# 16K-floor rows after the FP8 split rule (FP8 may be faster where a graph's batch range fills the wave);
# (d) 71f9a27's two reverted changes as opt-in options (C1_VARIANTS A/B), the sweep (STEPS=3) if one wins.
# Stop 29 did (a) (`tok:tr=1`: no change), (b) (FP8 head_dim 64 wv=4: default now), (c) (engine matched 32K
# at 1024 output tokens: 1.28x) and timed decode_mma's lazy rescale (no gain) -- benchmarks/device/s29.sh.
# NOTE: no nibble order saves integer ops on the E4M3 route (7 a word is the minimum: a word has no tiling by
# two shifts of the E4M3 bit pattern); direct fp16 placement would need >= 9 plus the 4 scale multiplies.
# For stop 30: (d) below; lz with pf=1 and no spills (fewer live registers).
# Usage from the repo root: OUT=... COMMIT=<sha> STEPS="1 2" bash benchmarks/device/next.sh
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
  timeout -k 5 230 python3 -m pytest -q -x tests/test_kernels_decode.py \
    -k "tail_in_grid or active_rows or combine or empty_splits or no_tail" > "$OUT/gpu-tests-options.log" 2>&1
  echo "gpu tests exit $?"; tail -2 "$OUT/gpu-tests-options.log"
  dirs=()
  for v in ${C1_VARIANTS:-fp8 mma mma:ts=2 mma:ts=4 fp8 mma:ts=4 mma:ts=2 mma}; do
    tag=c1-${v//[:=,]/_}-${#dirs[@]}; dt=nvfp4; [[ $v == fp8 ]] && dt=fp8_e4m3
    NIBBLEKV_DECODE_VARIANT=${v/fp8/} timeout -k 5 75 python3 benchmarks/bench_engine.py --out "$OUT/$tag" --part long \
      --long-model llama-3.1-8b --synthetic-prefill --long-input 2700 --long-requests 1 --long-output 48 \
      --profile-steps 4 --profile-top 12 --kv-dtypes $dt > "$OUT/$tag.log" 2>&1
    echo "$v exit $?"; dirs+=("$OUT/$tag"); rm -f "$OUT/$tag.log"
  done
  merge engine-c1-${C1_NAME:-ts} "${dirs[@]}"
fi
if [[ $STEPS == *" 2 "* ]]; then
  timeout -k 5 200 python3 benchmarks/bench_engine.py --out "$OUT/tput" --part throughput \
    --throughput-models smollm2-135m --throughput-repeats 2 > "$OUT/compiles.log" 2>&1
  echo "throughput exit $?"; merge engine-throughput-smollm2-compiles "$OUT/tput"
fi
if [[ $STEPS == *" 3 "* ]]; then
  NIBBLEKV_DECODE_VARIANT=${V:-} timeout -k 5 480 python3 benchmarks/bench_prefix.py --out "$OUT" \
    --workloads agentic --kv-dtypes fp8_e4m3 nvfp4 bf16 --top-only hicache+bf16 --repeats 3 \
    --enable-overlap-schedule > "$OUT/prefix-h200.log" 2>&1
  echo "prefix exit $?"; grep '^{' "$OUT/prefix-h200.log" | cut -c1-150
fi
if [[ $STEPS == *" 4 "* ]]; then
  timeout -k 5 80 python3 -m pytest -q -x tests/test_kernels_write.py tests/test_kernels_decode.py \
    -k "4over6 or demote or combine_online or active_rows" > "$OUT/gpu-tests-write-combine.log" 2>&1
  echo "gpu tests exit $?"; tail -2 "$OUT/gpu-tests-write-combine.log"
  timeout -k 5 ${C12_TIMEOUT:-150} python3 benchmarks/bench_prefix.py --out "$OUT" --name prefix-c12-h200 \
    --workloads agentic --kv-dtypes fp8_e4m3 nvfp4 --hicache off --concurrency 1 2 --repeats 3 \
    --enable-overlap-schedule > "$OUT/prefix-c12-h200.log" 2>&1
  echo "prefix c1/c2 exit $?"; grep '^{' "$OUT/prefix-c12-h200.log" | cut -c1-150
fi
