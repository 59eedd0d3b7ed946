#!/bin/bash
# FP8 weights (issue 48): benchmarks/bench_fp8.py on one GPU -- the FP8 linear layers (per-channel weights:
# torch._scaled_mm row-wise; 128x128 block weights: the Triton block GEMM; activation quantization included)
# against bf16 torch.mm at Llama-3.1-8B's projections (qkv, o, gate_up, down), M = 1, 16, 64, 128, 256 and
# 8192, each a CUDA-graph replay with L2 emptied per call, beside the read ceiling of the same run; every row
# is checked against the pure-torch reference first. ~3 min on an H200. With GGUF_PATH (the SmolLM2 GGUF,
# rebuilt by gguf.sh) also benchmarks/eval_fp8_weights.py on it: KL / top-1 of --quantization fp8 against
# the bf16 weights. Then the 8B engine's decode step with FP8 weights at 1 and 16 tokens (2K context, both 4-
# and 8-bit KV; docs/results.md "The FP8 decode step at 1-16 tokens"), ~1.5 min. Engine rows with FP8 weights:
#   ENGINE_ARGS="--quantization fp8" bash benchmarks/device/engine.sh
# The persistent TMA GEMM's tile sweep beside the default GEMM, cuBLASLt and bf16 (fp8-tma-<gpu>.json, ~5 min):
#   FP8_ARGS="--tma --formats channel --ms 1 16 64 128 256" T_FP8_STEP=0 bash benchmarks/device/fp8.sh
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/fp8.sh [GGUF_PATH]
# Env: COMMIT (the commit under test), FP8_ARGS (more bench_fp8.py flags), T_FP8 (timeout in s, 540),
# T_FP8_EVAL (timeout in s, 240), T_FP8_STEP (timeout in s, 200; 0 skips the engine step).
# $OUT gets: fp8-weights-<gpu>.json (<gpu>: h200, h100, ... as benchmarks/timing.py's gpu_tag; rows kind=gemm:
# m, n, k, format, fp8_us, fp8_gemm_us, bf16_us, speedup, read_frac at M <= 16; acceptance; commit, gpu, date),
# fp8-weights-<gpu>.png, fp8-weights-<gpu>.log, gpu.txt, with GGUF_PATH fp8-weights-accuracy.json, and
# fp8-small-batch/bench_engine.json (+ .png, .log).
set -o pipefail
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown} HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source "$(dirname "$0")/common.sh"
gpu_info
TAG=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import timing; print(timing.gpu_tag())")
case " ${FP8_ARGS:-} " in *" --tma "*) LOG="$OUT/fp8-tma-$TAG.log" ;; *) LOG="$OUT/fp8-weights-$TAG.log" ;; esac
# shellcheck disable=SC2086 # FP8_ARGS is a set of flags, split on purpose
run_bench "${T_FP8:-540}" "$LOG" 70 benchmarks/bench_fp8.py --out "$OUT" ${FP8_ARGS:-}
rc=$?
if [ -n "${1:-}" ]; then
    # as eval.sh: the device has no `gguf` package; import it from a carried wheel in .whl/
    if ! python3 -c "import gguf" 2>/dev/null; then
        for w in "$PWD"/.whl/gguf-*.whl; do
            [ -f "$w" ] && export PYTHONPATH="$PYTHONPATH:$w"
        done
    fi
    timeout -k 10 "${T_FP8_EVAL:-240}" python3 benchmarks/eval_fp8_weights.py --model "$1" --out "$OUT" \
        >>"$LOG" 2>&1
    erc=$?
    echo "eval_fp8_weights: exit $erc"
    tail -n 30 "$LOG"
    [ "$rc" -eq 0 ] && rc=$erc
fi
if [ "${T_FP8_STEP:-200}" != 0 ]; then
    mkdir -p "$OUT/fp8-small-batch"
    timeout -k 10 "${T_FP8_STEP:-200}" python3 benchmarks/bench_engine.py --part long --long-requests 1 16 \
        --long-input 2048 --long-output 48 --quantization fp8 --kv-dtypes nvfp4 fp8_e4m3 --synthetic-prefill \
        --profile-steps 3 --out "$OUT/fp8-small-batch" >"$OUT/fp8-small-batch/bench_engine.log" 2>&1
    src=$?
    echo "bench_engine (FP8 decode step at 1 / 16 tokens): exit $src"
    tail -n 6 "$OUT/fp8-small-batch/bench_engine.log"
    [ "$rc" -eq 0 ] && rc=$src
fi
exit $rc
