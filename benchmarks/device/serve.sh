#!/bin/bash
# Serving benchmark on one GPU (docs/results.md): for each KV dtype, start `nibblekv serve` on the bundled
# SmolLM2 GGUF (rebuilt on the device by gguf.sh), run `nibblekv bench serve` on the random (300 prompts,
# 512-1024 in, 128-256 out) and shared-prefix (16 groups sharing a ~2K-token system prompt) datasets at 64
# concurrent clients, stop the server (SIGTERM). ~8 min on an H200.
# Usage from the repo root: OUT=DIR COMMIT=<sha> bash benchmarks/device/serve.sh GGUF_PATH
# Env: COMMIT, SMOKE=1 (CPU, tiny sizes: tests/test_device_serve.py runs it), KV_DTYPES, NUM_PROMPTS,
# TOTAL_S (deadline for everything), TAG (file names, default h200), PORT0, WORK (scratch folder).
# $OUT gets at most 4 files (the device returns 8): device_serve.log, serve-$TAG.json and .png (merged,
# by plot_serve.py) and serve-$TAG-raw.tar.gz (per-run JSONs, server logs, server info), repacked after
# every run so that a run cut short still returns what finished.
set -o pipefail
# HF_HUB_OFFLINE: the device has no network; the tokenizer comes from the GGUF itself.
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.} HF_HUB_OFFLINE=1
gguf=${1:?usage: benchmarks/device/serve.sh GGUF_PATH}
OUT=${OUT:-/tmp/out}
SMOKE=${SMOKE:-0}
KV_DTYPES=${KV_DTYPES:-bf16 fp8_e4m3 nvfp4}
PORT0=${PORT0:-30100}
COMMIT=${COMMIT:-unknown}
start_s=$(date +%s)
if [ "$SMOKE" = 1 ]; then
    TAG=${TAG:-cpu-smoke}
    TOTAL_S=${TOTAL_S:-1500}
    HEALTH_S=${HEALTH_S:-300}
    BENCH_MAX_S=${BENCH_MAX_S:-600}
    # CPU: a small pool; sizes only prove the pipeline, the numbers mean nothing.
    server_args=(--device cpu --max-total-tokens 4096 --max-running-requests 8)
    warm_args=(--num-prompts 2 --random-input-len 16 --random-output-len 4 --max-concurrency 2)
    random_args=(--num-prompts 8 --random-input-len 48 --random-output-len 12 --random-range-ratio 0.5
        --max-concurrency 4)
    gsp_args=(--num-prompts 8 --gsp-num-groups 2 --gsp-prompts-per-group 4 --gsp-system-prompt-len 96
        --gsp-question-len 8 --gsp-output-len 8 --max-concurrency 4)
else
    TAG=${TAG:-h200}
    TOTAL_S=${TOTAL_S:-540}  # the device stops a command at 600 s; leave time to pack
    HEALTH_S=${HEALTH_S:-180}  # the first start compiles the Triton kernels (~1 min expected)
    # Expected 15-60 s per bench; a cap keeps one stuck run from eating the other dtypes' time.
    BENCH_MAX_S=${BENCH_MAX_S:-180}
    NUM_PROMPTS=${NUM_PROMPTS:-300}  # random; shared-prefix runs 16 groups x ceil(N * 0.85 / 16)
    per_group=$(((NUM_PROMPTS * 85 / 100 + 15) / 16))
    # 0.5 of an H200 is ~3M tokens of bf16 KV for this model: every request and the whole prefix
    # cache fit, so the dtypes differ in speed only. CUDA graphs up to the concurrency.
    server_args=(--mem-fraction-static 0.5 --max-running-requests 64 --cuda-graph-max-bs 64
        --chunked-prefill-size 4096)
    # Warm-up (not recorded): the first requests compile the extend kernels' length variants.
    warm_args=(--num-prompts 64 --random-input-len 1024 --random-output-len 16 --random-range-ratio 0.1
        --max-concurrency 32)
    # 300 prompts of 512-1024 token ids, 128-256 output tokens, 64 in flight.
    random_args=(--num-prompts "$NUM_PROMPTS" --random-input-len 1024 --random-output-len 256
        --random-range-ratio 0.5 --max-concurrency 64)
    # 16 groups x 16 questions sharing a ~2K-token system prompt (radix cache hits), 128 output tokens.
    gsp_args=(--num-prompts $((16 * per_group)) --gsp-num-groups 16 --gsp-prompts-per-group "$per_group"
        --gsp-system-prompt-len 2048 --gsp-question-len 128 --gsp-output-len 128 --max-concurrency 64)
fi
WORK=${WORK:-/tmp/serve-work-$TAG}
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/serve-*.json "$WORK"/server-*.json "$WORK"/server-*.log "$WORK"/bench-*.txt  # an earlier run's
# tee ignores TERM/INT: an outer `timeout` signals the whole process group, and a dead tee would
# kill this script (SIGPIPE) before it packs the results.
exec > >(trap '' TERM INT; exec tee -a "$OUT/device_serve.log") 2>&1

left() { echo $((start_s + TOTAL_S - $(date +%s))); }
log() { echo "[device_serve $(date +%T) +$(($(date +%s) - start_s))s] $*"; }
pack() {  # per-run files -> one tarball (the device returns at most 8 files)
    tar czf "$OUT/.raw.tmp" -C "$WORK" . && mv "$OUT/.raw.tmp" "$OUT/serve-$TAG-raw.tar.gz"
}
get() {  # GET a URL; exit 0 on HTTP 200 (python: curl may be missing on the device)
    python3 -c 'import sys, urllib.request as u; r = u.urlopen(sys.argv[1], timeout=5); sys.stdout.write(r.read().decode())' "$1" 2>/dev/null
}

server_pid=
stop_server() {
    [ -n "$server_pid" ] || return 0
    kill -TERM "$server_pid" 2>/dev/null
    # The server drains in-flight requests (--drain-timeout 10), then exits.
    for _ in $(seq 1 30); do kill -0 "$server_pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$server_pid" 2>/dev/null; then
        log "server $server_pid ignored SIGTERM for 30 s: SIGKILL"
        kill -KILL "$server_pid" 2>/dev/null
    fi
    wait "$server_pid" 2>/dev/null
    log "server exited with code $?"
    server_pid=
}
trap 'pack; stop_server; pack' EXIT  # pack first: stopping can take 30 s
trap 'exit 143' TERM INT  # an outer `timeout` still stops the server and packs the results

start_server() {  # $1 dtype, $2 port; 0 once /health answers 200, 1 if it died, 2 if it never answered
    python3 -m nibblekv serve --model "$gguf" --kv-cache-dtype "$1" --port "$2" --drain-timeout 10 \
        --decode-log-interval 200 "${server_args[@]}" >"$WORK/server-$1.log" 2>&1 &
    server_pid=$!
    local deadline=$(($(date +%s) + HEALTH_S))
    while [ "$(date +%s)" -lt "$deadline" ] && [ "$(left)" -gt 0 ]; do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            log "server ($1) died while starting; its log ends:"; tail -30 "$WORK/server-$1.log"
            wait "$server_pid"; server_pid=; return 1
        fi
        get "http://127.0.0.1:$2/health" >/dev/null && return 0
        sleep 1
    done
    log "server ($1) not healthy in $HEALTH_S s; its log ends:"; tail -30 "$WORK/server-$1.log"
    return 2
}

bench() {  # $1 name, $2 port, rest: bench flags; guarded by the time left
    local name=$1 port=$2 budget
    shift 2
    budget=$(($(left) - 30))
    [ "$budget" -le "$BENCH_MAX_S" ] || budget=$BENCH_MAX_S
    if [ "$budget" -lt 20 ]; then log "skip $name: $(left) s left"; return 1; fi
    log "bench $name (at most $budget s)"
    timeout "$budget" python3 -m nibblekv bench serve --base-url "http://127.0.0.1:$port" \
        --disable-progress --timeout 300 "$@" 2>&1 | tee "$WORK/bench-$name.txt"
}

log "gguf=$gguf SMOKE=$SMOKE KV_DTYPES=$KV_DTYPES TOTAL_S=$TOTAL_S commit=$COMMIT"
[ -s "$gguf" ] || { log "no GGUF at $gguf"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -c 'import torch, transformers, fastapi, uvicorn, pydantic, gguf; print("torch", torch.__version__,
"cuda", torch.cuda.is_available(), "transformers", transformers.__version__, "fastapi", fastapi.__version__,
"uvicorn", uvicorn.__version__, "pydantic", pydantic.__version__)' || exit 1

failures=0
i=0
for dtype in $KV_DTYPES; do
    port=$((PORT0 + i)); i=$((i + 1))
    if [ "$(left)" -lt 60 ]; then log "skip $dtype: $(left) s left"; failures=$((failures + 1)); continue; fi
    log "start server kv=$dtype port=$port"
    start_server "$dtype" "$port"
    rc=$?
    if [ "$rc" != 0 ]; then
        failures=$((failures + 1)); stop_server; pack
        # A crash may be dtype-specific: try the next one. A hang would likely repeat and eat the budget.
        [ "$rc" = 1 ] && continue
        log "giving up on the remaining dtypes"; break
    fi
    log "server kv=$dtype healthy"
    get "http://127.0.0.1:$port/get_server_info" >"$WORK/server-info-$dtype.json"
    bench "warmup-$dtype" "$port" --dataset random --random-token-ids --seed 7 "${warm_args[@]}" >/dev/null
    bench "random-$dtype" "$port" --dataset random --random-token-ids "${random_args[@]}" \
        --output-file "$WORK/serve-random-$dtype.json" || failures=$((failures + 1))
    bench "shared-prefix-$dtype" "$port" --dataset shared-prefix "${gsp_args[@]}" \
        --output-file "$WORK/serve-shared-prefix-$dtype.json" || failures=$((failures + 1))
    grep -m 2 -E "KV cache is allocated|max_total_num_tokens=" "$WORK/server-$dtype.log"
    grep "Decode batch" "$WORK/server-$dtype.log" | tail -1
    stop_server
    pack
done

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
python3 benchmarks/plot_serve.py --results "$WORK" --out "$OUT/serve-$TAG" --commit "$COMMIT" \
    --gpu "${gpu:-cpu}" --note "benchmarks/device/serve.sh SMOKE=$SMOKE" || failures=$((failures + 1))
log "done: $failures failed step(s)"
[ "$failures" = 0 ]
