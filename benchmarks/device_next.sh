#!/bin/bash
# H200 calls for what stop 25 left unmeasured (~20 min in all: STEPS="1" then STEPS="2 3 4"). $OUT gets logs/JSON.
#   1) Issue 6's agentic sweep (as benchmarks/device_prefix_ab.sh) at the tree with the prefill rotation as
#      one GEMM (bac7dd1: nvfp4's prefill step 1.041x -> 1.016x fp8's, profile-prefill-h200.json): is the
#      1-8 session tie (nvfp4 0.989-1.016x fp8, TTFT 4-8% above) gone? Then the prefill profile with 4
#      requests a step (the c=8 regime) and at the 1-request shape again (the step walls drift +-1 ms a run);
#      bench_rope.py: fused vs GEMM path between 64 and 512 tokens (the switch is at 512, unmeasured in between).
#   2) Why SmolLM2's offline throughput with nvfp4 is 0.38x bf16's (engine-throughput-h200.json): a profiled
#      decode step at the throughput bench's regime (256 requests of ~600 tokens), every dtype.
#   3) The 8B offline throughput with the in-graph demotion and the balanced split-K default (untimed: stop
#      24's cold run passed its 170 s limit; bal=0 gave 8847 output tok/s, engine-throughput-8b-nvfp4-bal0-h200.json).
#   4) FP8 decode where it misses issue 3's 0.75 by a hair (kernels-h200.json, dec4a75): GQA 4 32 x 8K with the
#      tail 0.745, GQA 8 8 x 32K 0.748 and 32 x 8K 0.744 -- num_stages / block_n of decode_tok around the default.
# (Stop 25 ran the old steps 0 and 4: kernels-h200.json at dec4a75, 20 warps per SM -- slower.)
# Usage from the repo root: OUT=... COMMIT=<sha> STEPS="1" bash benchmarks/device_next.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
STEPS=" ${STEPS:-1 2 3 4} "
mkdir -p "$OUT"
if [[ $STEPS == *" 1 "* ]]; then
  timeout -k 5 440 python3 benchmarks/bench_prefix.py --out "$OUT" --workloads agentic --kv-dtypes fp8_e4m3 nvfp4 bf16 \
    --top-only hicache+bf16 --repeats 3 --enable-overlap-schedule > "$OUT/prefix-h200.log" 2>&1
  echo "prefix exit $?"; grep -v "^{\|arn" "$OUT/prefix-h200.log" | tail -24
  timeout -k 5 90 python3 benchmarks/bench_rope.py --out "$OUT" > "$OUT/rope.log" 2>&1
  echo "rope exit $?"; grep -v arn "$OUT/rope.log"
  for b in 1 4; do
    timeout -k 5 120 python3 benchmarks/profile_prefill.py --out "$OUT/pp$b" --kv-dtypes fp8_e4m3 nvfp4 --repeats 7 \
      --batch $b > "$OUT/profile-prefill-x$b.log" 2>&1
    echo "profile x$b exit $?"; grep " step " "$OUT/profile-prefill-x$b.log"
  done
fi
if [[ $STEPS == *" 2 "* ]]; then
  timeout -k 5 150 python3 benchmarks/bench_engine.py --out "$OUT/profile" --part long --long-model smollm2-135m \
    --synthetic-prefill --long-input 600 --long-requests 256 --long-output 32 --profile-steps 2 \
    > "$OUT/profile.log" 2>&1
  echo "profile exit $?"; grep -v '^{' "$OUT/profile.log" | grep -v Warning | tail -6
fi
if [[ $STEPS == *" 3 "* ]]; then
  timeout -k 5 300 python3 benchmarks/bench_engine.py --out "$OUT/throughput" --part throughput \
    --throughput-models llama-3.1-8b > "$OUT/throughput.log" 2>&1
  echo "throughput exit $?"; grep -v '^{' "$OUT/throughput.log" | grep -v Warning | tail -6
fi
if [[ $STEPS == *" 4 "* ]]; then
  for q in 32 64; do
    timeout -k 5 150 python3 benchmarks/bench_decode_variants.py --out "$OUT/fp8-gqa$((q / 8))" --budget-s 120 --tail \
      --q-heads $q --shapes 8x32768 32x8192 --variants fp8_e4m3=tok fp8_e4m3=tok:s=6 fp8_e4m3=tok:s=4 \
      fp8_e4m3=tok:bn=64 fp8_e4m3=tok:bn=64,s=6 > "$OUT/fp8-gqa$((q / 8)).log" 2>&1
    echo "fp8 gqa$((q / 8)) exit $?"; grep -v "arn" "$OUT/fp8-gqa$((q / 8)).log" | tail -9
  done
fi
