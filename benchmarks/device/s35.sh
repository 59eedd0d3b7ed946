#!/bin/bash
# H200 A/B for the host work of a decode step (stop 35): the baseline tree (BASE, a copy of an earlier
# commit's nibblekv/ + bench_engine.py, untracked) against this tree, run back to back on one machine.
#   1) SmolLM2-135M offline throughput (issue 4's shape: 256 requests, in/out 100-1024), every dtype,
#      timed twice.
#   2) 256 running SmolLM2 requests of ~600 tokens: decode step time vs the GPU's busy time (profiled steps).
#   3) MATCHED=1: issue 4's matched row (dummy Llama-3.1-8B, 26 x 32K, fp8_e4m3 and nvfp4), both trees.
#   LONG_TREES: the trees of step 2 (default "base new"); LONG_FIRST=1 runs step 2 before step 1.
# Usage from the repo root: OUT=... BASE=base_tree bash benchmarks/device/s35.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
BASE=${BASE:-base_tree}
ROOT=$(pwd)
mkdir -p "$OUT"
run() {  # $1 = tag, $2 = tree root, rest = bench_engine args
  local tag=$1 tree=$2; shift 2
  local c=$COMMIT; [ "$tree" != "$ROOT" ] && c=${BASE_COMMIT:-base}
  (cd "$tree" && COMMIT=$c PYTHONPATH=. timeout -k 5 "$T" python3 "$ROOT/benchmarks/bench_engine.py" \
    --out "$OUT/$tag" "$@" > "$OUT/$tag.log" 2>&1)
  echo "$tag exit $?"; grep '^{' "$OUT/$tag.log" | cut -c1-300
}
tput() {
for tree in base new; do
  root=$ROOT; [ $tree = base ] && root=$ROOT/$BASE
  T=${T_TPUT:-170} run "tput-$tree" "$root" --part throughput --throughput-models smollm2-135m \
    --throughput-repeats 2
done
}
long() {
for tree in ${LONG_TREES:-base new}; do
  root=$ROOT; [ $tree = base ] && root=$ROOT/$BASE
  T=${T_LONG:-75} run "long-$tree" "$root" --part long --long-model smollm2-135m --long-input 600 \
    --long-output 32 --long-requests 256 --synthetic-prefill --profile-steps 2 --profile-top 12 \
    --kv-dtypes bf16 nvfp4
done
}
if [ "${LONG_FIRST:-0}" = 1 ]; then long; tput; else tput; long; fi
[ "${MATCHED:-0}" = 1 ] || exit 0
for tree in base new; do
  root=$ROOT; [ $tree = base ] && root=$ROOT/$BASE
  T=${T_MATCHED:-100} run "matched-$tree" "$root" --part long --long-model llama-3.1-8b --synthetic-prefill \
    --long-input 32768 --long-requests 26 --long-output 1024 --profile-steps 4 --kv-dtypes fp8_e4m3 nvfp4
done
