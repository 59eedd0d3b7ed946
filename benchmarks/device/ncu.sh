#!/bin/bash
# Nsight Compute reports of one tool (docs/results.md, where the decode kernels' cycles go): one ncu report
# per argument string (one profiled kernel each, so its source page is that kernel's), each exported as
# the raw page and the SASS source page, then summarized into one JSON by the tool.
# Usage from the repo root:
#   OUT=DIR COMMIT=<sha> NAME=decode-ncu-h200 bash benchmarks/device/ncu.sh \
#     "--shapes nvfp4:19x163840" "--head-dim 256 --kv-heads 2 --shapes nvfp4:8x32768:16"
# Env: COMMIT, NAME (result file name, no .json), TOOL (benchmarks/tools/ncu_TOOL.py: decode), KERNELS (ncu's
# -k filter, regex:^decode_(mma|tok) for decode), T_RUN (timeout of each report in s, 240).
# $OUT gets: $NAME.json, $NAME.log (every run's output under its command), $NAME-csv.tar.gz (the exported
# pages) and gpu.txt (nvidia-smi); the reports stay in $WORK (/tmp/ncu).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
NAME=${NAME:-decode-ncu}
TOOL=${TOOL:-decode}
KERNELS=${KERNELS:-regex:^decode_(mma|tok)}
WORK=${WORK:-/tmp/ncu}
mkdir -p "$OUT" "$WORK"
source "$(dirname "$0")/common.sh"
gpu_info
: >"$OUT/$NAME.log"
pairs=()
srcs=()
i=0
for args in "$@"; do
    i=$((i + 1))
    rep="$WORK/r$i"
    echo "==== ncu -k $KERNELS --set full python3 benchmarks/tools/ncu_$TOOL.py $args" >>"$OUT/$NAME.log"
    # shellcheck disable=SC2086 # each argument string is a set of flags, split on purpose
    timeout -k 10 "${T_RUN:-240}" ncu --profile-from-start off --clock-control none --set full \
        --import-source no -k "$KERNELS" -o "$rep" -f python3 "benchmarks/tools/ncu_$TOOL.py" $args \
        >"$rep.log" 2>&1
    echo "report $i: exit $?"
    tail -n 5 "$rep.log"
    cat "$rep.log" >>"$OUT/$NAME.log"
    [ -f "$rep.ncu-rep" ] || continue
    ncu -i "$rep.ncu-rep" --page raw --csv >"$rep.raw.csv" && pairs+=("$rep.raw.csv" "$rep.log")
    src="$WORK/sass$i.csv"
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$src" && srcs+=("$src")
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
python3 "benchmarks/tools/ncu_$TOOL.py" --summarize "${pairs[@]}" --sass "${srcs[@]}" --gpu "$gpu" \
    --out "$OUT/$NAME.json"
# the CSVs behind the JSON, to re-summarize without a GPU
tar -C "$WORK" -czf "$OUT/$NAME-csv.tar.gz" $(cd "$WORK" && ls -- *.csv *.log)
