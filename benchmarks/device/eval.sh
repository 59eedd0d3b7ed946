#!/bin/bash
# KV accuracy on one GPU (docs/results.md, docs/accuracy.md): `nibblekv eval kv` on the bundled SmolLM2
# GGUF (rebuilt on the device by gguf.sh), every KV configuration in one run through the engine's own CUDA
# kernels: KL / top-1 / perplexity over 16 windows of 2048 tokens, decode over 256 true tokens, passkey
# retrieval up to 8K. ~2 min on an H200.
# Usage from the repo root: OUT=DIR bash benchmarks/device/eval.sh GGUF_PATH [DATA_DIR=.data/austen]
#     [more `nibblekv eval kv` flags]
# DATA_DIR: a folder of .txt files (the Austen texts); carry it to the device (an ignored folder such as
# .data/austen, named in the call's carry). Env: CONFIGS (the KV configurations), SMOKE=1 (CPU, tiny sizes).
# $OUT gets: kv-accuracy.json (every configuration's metrics) and kv-accuracy-h200.log (the run's output).
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
# The acceptance rows, nvfp4 without the prefill window, and the default's neighbours: without the sink
# page, with a 128-token tail, with calibrated scales (docs/accuracy.md).
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
    --out "$OUT/kv-accuracy.json" "$@" 2>&1 | tee "$OUT/kv-accuracy-h200.log"
