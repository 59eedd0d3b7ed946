#!/bin/bash
# Engine benchmark (docs/results.md, long context and offline throughput): benchmarks/bench_engine.py on one
# GPU, dummy weights, every KV dtype (bf16 / fp8_e4m3 / nvfp4), CUDA graphs and the overlap schedule on.
#   long:       Llama-3.1-8B, 32K-token prompts (prefilled synthetically), 1024 output tokens; matched (as
#               many requests as bf16 holds) and capacity (as many as each dtype's pool holds), 4 steps
#               profiled (~8 min);
#   floor:      16K in x 48 requests, 16 out: the step against its memory floor with >= 32 running (~1 min);
#   throughput: 256 requests, random input and output 100-1024 tokens, SmolLM2-135M and Llama-3.1-8B
#               shapes, the workload timed once after an untimed warm-up (~4 min).
# Then the parts found under $OUT are merged into one JSON and plot (benchmarks/plot_engine.py --merge).
# Usage from the repo root: OUT=DIR COMMIT=<sha> [PARTS="long floor throughput"] bash benchmarks/device/engine.sh
# Env: PARTS (which parts, in order; all three take ~13 min: on a machine that stops a command at 10 min run
# PARTS=long, then PARTS="floor throughput" with the same OUT kept on the machine, or merge the copies later:
# python3 benchmarks/plot_engine.py engine-h200.json --merge long=L.json floor=F.json throughput=T.json),
# COMMIT, T_LONG / T_FLOOR / T_THROUGHPUT (timeouts in s: 570 / 200 / 420), ENGINE_ARGS (more
# bench_engine.py flags for every part).
# $OUT gets: long/, floor/, throughput/ (each part's bench_engine.{json,png}), engine-h200.{json,png} (the
# merged parts present) and engine-h200.log (each part's output, one after another).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
PARTS=${PARTS:-long floor throughput}
mkdir -p "$OUT"
failures=0
for part in $PARTS; do
    case $part in
        long) limit=${T_LONG:-570}
            flags=(--part long --synthetic-prefill --long-input 32768 --long-output 1024 --profile-steps 4) ;;
        floor) limit=${T_FLOOR:-200}
            flags=(--part long --synthetic-prefill --long-input 16384 --long-requests 48 --long-output 16) ;;
        throughput) limit=${T_THROUGHPUT:-420}
            flags=(--part throughput) ;;
        *) echo "engine.sh: unknown part '$part' (PARTS takes long, floor, throughput)" >&2; exit 2 ;;
    esac
    mkdir -p "$OUT/$part"
    echo "== $part: bench_engine.py ${flags[*]} ${ENGINE_ARGS:-}" >>"$OUT/engine-h200.log"
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" python3 benchmarks/bench_engine.py "${flags[@]}" ${ENGINE_ARGS:-} --out "$OUT/$part" \
        >>"$OUT/engine-h200.log" 2>&1
    rc=$?
    echo "$part: exit $rc"
    [ "$rc" = 0 ] || failures=$((failures + 1))
done
merge=()
for part in long floor throughput; do
    for f in "$OUT/$part"/bench_engine.json "$OUT/$part"/bench_engine_smoke.json; do  # smoke: ENGINE_ARGS=--smoke
        [ -s "$f" ] && merge+=("$part=$f")
    done
done
if [ ${#merge[@]} -gt 0 ]; then
    python3 benchmarks/plot_engine.py "$OUT/engine-h200.json" --merge "${merge[@]}" || failures=$((failures + 1))
fi
grep -E "^(kv_dtype|model|bf16|fp8|nvfp4|smollm2|llama)" "$OUT/engine-h200.log" | tail -n 30
[ "$failures" = 0 ]
