#!/bin/bash
# Tensor parallelism on 2 GPUs of one host (docs/results.md, nvidia-h200-x2), every step logged to a file
# under $OUT (a timed-out call returns no stdout), then the logs' tails printed:
#   1) the TP tests that need NCCL (two engines with CUDA graphs back to back in one process: shutdown);
#   2) benchmarks/bench_tp.py, dummy Llama-3.1-70B at --tp 2: each dtype's pool and decode at 32K context,
#      10 and 20 requests (matched) and as many as each pool holds, 16 output tokens, 3 steps profiled;
#   3) `nibblekv generate --tp-size 2` on a dummy Llama-3.1-8B: the CLI path end to end.
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/tp.sh   (~8 min)
# Env: COMMIT (the commit under test: the device copy's git HEAD may differ), TP70B_TIMEOUT (s, 420),
# GEN_TIMEOUT (s, 120), TP_ARGS (more bench_tp.py flags).
# $OUT gets: tp-70b/bench_tp.json (rows per dtype, written after each), bench-tp-70b.log, tests-tp.log,
# generate-tp2.log, summary.txt (each step's exit code) and gpu.txt.
# NOTE: one dtype's engine start and runs take ~40-60 s at 70B. NCCL's teardown blocks while a CUDA graph
# holding captured all-reduces is alive (pytorch#115388): every rank frees its graphs first, and
# `timeout -k` kills a run that hangs anyway.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.used --format=csv >"$OUT/gpu.txt" 2>&1
# two NCCL engines with CUDA graphs back to back in one process (the shutdown path)
timeout -k 10 150 python3 -m pytest -q tests/test_tp.py -k "nccl or shutdown or stuck" >"$OUT/tests-tp.log" 2>&1
echo "pytest tp: exit $?" | tee -a "$OUT/summary.txt"
timeout -k 15 "${TP70B_TIMEOUT:-420}" python3 benchmarks/bench_tp.py --output-len 16 --max-running-requests 64 \
    --matched-requests 10 20 --profile-steps 3 ${TP_ARGS:-} --out "$OUT/tp-70b" >"$OUT/bench-tp-70b.log" 2>&1
echo "bench_tp 70B: exit $?" | tee -a "$OUT/summary.txt"
timeout -k 15 "${GEN_TIMEOUT:-120}" python3 -m nibblekv generate --model llama-3.1-8b --load-format dummy --tp-size 2 \
    --max-new-tokens 16 --ignore-eos "hello" >"$OUT/generate-tp2.log" 2>&1
echo "generate --tp 2: exit $?" | tee -a "$OUT/summary.txt"
for f in "$OUT"/tests-tp.log "$OUT"/bench-tp-70b.log "$OUT"/generate-tp2.log; do
    echo "== $f"
    grep -v Warning "$f" | tail -n 15
done
