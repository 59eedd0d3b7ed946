#!/bin/bash
# Accuracy eval on the device (issue 5): `nibblekv eval kv` on the bundled SmolLM2 GGUF, every KV
# configuration in one run, through the engine's own CUDA kernels.
# Usage: OUT=... bash benchmarks/device/eval.sh GGUF_PATH [DATA_DIR=.data/austen] [extra eval args...]
# The Austen texts live in ../shared/data beside the checkout, which does not travel: copy them into
# the ignored .data/austen and carry that folder. Env: CONFIGS (names), SMOKE=1 (CPU, tiny sizes).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.} HF_HUB_OFFLINE=1
# The device has no `gguf` package and a pip install there does not persist between calls: import it from
# its carried wheel (a zip of pure Python) when one is in .whl/.
if ! python3 -c "import gguf" 2>/dev/null; then
    for w in "$PWD"/.whl/gguf-*.whl; do
        [ -f "$w" ] && export PYTHONPATH="$PYTHONPATH:$w"
    done
fi
gguf=${1:?usage: benchmarks/device/eval.sh GGUF_PATH [DATA_DIR] [eval args...]}
data=${2:-.data/austen}
shift $(($# >= 2 ? 2 : 1))
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The acceptance rows, the previous default (no prefill window), and the default's neighbours: without
# the sink page, with a 128-token tail, with calibrated scales (2026-11-30: the prefill window, each
# chunk reading the previous one in bf16, is the default now; docs/accuracy.md).
CONFIGS=${CONFIGS:-bf16 fp8_e4m3 nvfp4 nvfp4_plain nvfp4_w64_4o6_had_sink nvfp4_w64_4o6_had_pw \
nvfp4_w128_4o6_had_sink_pw nvfp4_w64_cal_4o6_had_sink_pw}
if [ "${SMOKE:-0}" = 1 ]; then
    sizes=(--device cpu --windows 2 --window-tokens 96 --prefill-chunk 32 --decode-context 48
        --decode-tokens 4 --batch 2 --calib-windows 1 --calib-tokens 128 --passkey-lengths 256
        --passkey-depths 0.5)
else
    # 16 windows of 2048 tokens; prefill in 512-token chunks (each attends through the cache);
    # decode: 1536 tokens of context, then 256 true tokens one at a time; passkey up to the model's 8K.
    sizes=(--device cuda --windows 16 --window-tokens 2048 --prefill-chunk 512 --decode-context 1536
        --decode-tokens 256 --batch 16 --passkey-lengths 1024 2048 4096 8192)
fi
# shellcheck disable=SC2086
python3 -m nibblekv eval kv --model "$gguf" --data-dir "$data" --configs $CONFIGS "${sizes[@]}" \
    --passkey-configs bf16 fp8_e4m3 nvfp4 nvfp4_plain nvfp4_w64_4o6_had_sink \
    --out "$OUT/kv-accuracy.json" "$@" 2>&1 | tee "$OUT/eval.log"
