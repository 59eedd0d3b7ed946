#!/bin/bash
# One call on nvidia-h200-x2 (issue 8): tensor parallelism on GPUs. Every step logs to a file under $OUT
# (a timed-out call returns no stdout: 2026-11-30 lost two bench_tp runs that way), then prints the tails.
#   1) benchmarks/bench_tp.py on the Llama-3.1-70B shape (each dtype's pool and decode at 32K context);
#   2) `nibblekv generate --tp 2` on a dummy Llama-3.1-8B: the CLI path end to end.
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/tp.sh
#   (env: TP70B_TIMEOUT, GEN_TIMEOUT, TP_ARGS)
# NOTE: one dtype's engine start and runs take ~40-60 s at 70B. Until 111f9ee every TP engine's shutdown hung
# on GPUs (2026-11-30, tp-h200x2-hang.log): NCCL's teardown blocks while a CUDA graph holding captured
# all-reduces is alive (pytorch#115388); every rank now frees its graphs first. `timeout -k` kills a hung run.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}  # COMMIT from this side: the device copy's git HEAD can be stale
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.used --format=csv >"$OUT/gpu.txt" 2>&1
# two NCCL engines with CUDA graphs back to back in one process (the shutdown hang of 2026-11-30)
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
