#!/bin/bash
# Stop 33, second call: (1) the engine at a GQA-16 shape (Llama-3.1-405B's layers, 4 of them, dummy
# weights): 32 requests x 32K, decode through decode_mma16 in CUDA graphs, per-kernel profile; (2) the whole
# kernel benchmark at this commit (extend_decode now merges in extend_triton's epilogue).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_s33b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/variants_run.sh
engine gqa16 260 --part long --long-model llama-3.1-405b --json-model-override-args '{"num_hidden_layers": 4}' \
  --kv-dtypes bf16 fp8_e4m3 nvfp4 --long-requests 32 --long-output 128 --synthetic-prefill --profile-steps 4
timeout -k 5 300 python3 benchmarks/bench_kernels.py --out "$OUT" > "$OUT/kernels-h200.log" 2>&1
echo "kernels exit $?"; grep -E "extend" "$OUT/kernels-h200.log" | head -40; tail -3 "$OUT/kernels-h200.log"
ls "$OUT"
