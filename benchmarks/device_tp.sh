#!/bin/bash
# One call on nvidia-h200-x2 (issue 8): tensor parallelism on GPUs. Every step logs to a file under $OUT
# (a timed-out call returns no stdout: 2026-11-30 lost two bench_tp runs that way), then prints the tails.
#   1) `nibblekv generate --tp 2` on a dummy Llama-3.1-8B: start-up, NCCL, CUDA graphs, a few tokens;
#   2) benchmarks/bench_tp.py on the 8B shape, then the 70B shape (each dtype's pool and decode at 32K).
# Usage from the repo root: OUT=... bash benchmarks/device_tp.sh  (env: GEN_TIMEOUT, TP8B_TIMEOUT, TP70B_TIMEOUT)
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,memory.used --format=csv >"$OUT/gpu.txt" 2>&1
timeout "${GEN_TIMEOUT:-150}" python3 -m nibblekv generate --model llama-3.1-8b --load-format dummy --tp-size 2 \
    --max-new-tokens 16 --ignore-eos "hello" >"$OUT/generate-tp2.log" 2>&1
echo "generate --tp 2: exit $?" | tee -a "$OUT/summary.txt"
timeout "${TP8B_TIMEOUT:-200}" python3 benchmarks/bench_tp.py --model llama-3.1-8b --output-len 16 \
    --out "$OUT/tp-8b" >"$OUT/bench-tp-8b.log" 2>&1
echo "bench_tp 8B: exit $?" | tee -a "$OUT/summary.txt"
timeout "${TP70B_TIMEOUT:-200}" python3 benchmarks/bench_tp.py --output-len 16 --out "$OUT/tp-70b" \
    >"$OUT/bench-tp-70b.log" 2>&1
echo "bench_tp 70B: exit $?" | tee -a "$OUT/summary.txt"
for f in "$OUT"/generate-tp2.log "$OUT"/bench-tp-8b.log "$OUT"/bench-tp-70b.log; do
    echo "== $f"
    grep -v Warning "$f" | tail -n 15
done
