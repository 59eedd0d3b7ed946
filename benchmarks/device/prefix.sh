#!/bin/bash
# Prefix-cache benchmark (docs/results.md, agentic sessions): benchmarks/bench_prefix.py on one GPU, dummy
# Llama-3.1-8B, the agentic workload (sessions whose every turn resends the history plus a new tool output)
# in the same 3 GiB KV budget for every dtype: fp8_e4m3 and nvfp4 at 1-32 concurrent sessions with the
# host tier off, and at 32 with it on (hicache); bf16 at 32 only, with and without (--top-only
# hicache+bf16). 3 repeats per row, the overlap schedule on. ~8 min on an H200. A hybrid model (e.g. --model
# qwen3.5-27b --kv-dtypes fp8_e4m3 nvfp4 --hicache off) needs fla-core as a wheel in .whl/; its baseline
# without state snapshots is --disable-radix-cache (under another --name).
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/prefix.sh [bench_prefix.py flags]
# Env: COMMIT (the commit under test: the device copy's git HEAD may differ), T_PREFIX (timeout in s, 540).
# $OUT gets: prefix-h200.json (rows, acceptance checks, commit, date; written after every row, so a cut
# run keeps what finished), prefix-h200.png and prefix-h200.log (the run's output).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
carried_wheels  # fla-core for a hybrid --model (carried in .whl/)
timeout -k 10 "${T_PREFIX:-540}" python3 benchmarks/bench_prefix.py --out "$OUT" --workloads agentic \
    --kv-dtypes fp8_e4m3 nvfp4 bf16 --top-only hicache+bf16 --repeats 3 --enable-overlap-schedule "$@" \
    >"$OUT/prefix-h200.log" 2>&1
rc=$?
echo "bench_prefix: exit $rc"
grep '^{' "$OUT/prefix-h200.log" | cut -c1-160
tail -n 5 "$OUT/prefix-h200.log"
exit $rc
