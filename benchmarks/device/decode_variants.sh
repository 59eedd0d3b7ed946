#!/bin/bash
# Decode kernel A/B (docs/results.md, decode kernels): benchmarks/bench_decode_variants.py once per argument
# string, then the runs merged into one result file -- e.g. the L2-resident probe and HBM, or two head_dims,
# every variant checked against the reference before it is timed.
# Usage from the repo root:
#   OUT=DIR COMMIT=<sha> NAME=decode-lazy-rescale-h200 TITLE="lazy rescale vs every step" \
#     bash benchmarks/device/decode_variants.sh "--tail --page-order l2 --variants nvfp4=mma nvfp4=mma:lz=4 \
#     --shapes 19x163840" "--tail --variants nvfp4=mma nvfp4=mma:lz=4 fp8_e4m3=tok --shapes 19x163840"
# Env: COMMIT (the commit under test: the device copy's git HEAD may differ), NAME (result file name, no
# .json), TITLE (the question), T_RUN (timeout of each run in s, 280).
# $OUT gets: $NAME.json (commit, gpu, date, title, runs), $NAME.log (every run's output under its command)
# and gpu.txt (nvidia-smi).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
NAME=${NAME:-decode-variants-merged}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
gpu_info
: >"$OUT/$NAME.log"
runs=()
i=0
for args in "$@"; do
    i=$((i + 1))
    dir="$OUT/run$i"
    mkdir -p "$dir"
    echo "==== PYTHONPATH=. python benchmarks/bench_decode_variants.py $args --out DIR" >>"$OUT/$NAME.log"
    # shellcheck disable=SC2086 # each argument string is a set of flags, split on purpose
    run_bench "${T_RUN:-280}" "$dir/log" 20 benchmarks/bench_decode_variants.py $args --out "$dir"
    cat "$dir/log" >>"$OUT/$NAME.log"
    [ -f "$dir/decode-variants.json" ] && runs+=("$dir/decode-variants.json")
done
if [ ${#runs[@]} -gt 0 ]; then
    python3 benchmarks/bench_decode_variants.py --merge "${runs[@]}" --name "$NAME" --title "${TITLE:-}" --out "$OUT"
fi
