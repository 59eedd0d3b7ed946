#!/bin/bash
# H200 calls for what stops 23-24 left unmeasured (~17 min in all: run STEPS="0" then STEPS="2 3 4"). $OUT gets logs/JSON.
#   0) GPU tests of the decode kernels (GQA groups over 16 now run as chunks of <= 16 heads, passed in stop 24;
#      the balanced split-K default), then the whole kernel benchmark at this tree (kernels-h200.json: the
#      last full one, 008fc4e, ran the balanced builds at tpi=1, the default is tpi=2 since da06152).
#   2) Why SmolLM2's offline throughput with nvfp4 is 0.38x bf16's (engine-throughput-h200.json): a profiled
#      decode step at the throughput bench's regime (256 requests of ~600 tokens), every dtype.
#   3) The 8B offline throughput with the in-graph demotion (the 2971a12 row of the README table), then nvfp4
#      again with per-pair splits (bal=0): 256 requests of 100-1024 tokens are ragged short batches, where the
#      balanced default (from 256 pairs) is untimed -- uniform 128 x 1K read 0.45 balanced vs 0.57 per-pair.
#      Stop 24 got only the bal=0 half (8847 output tok/s, engine-throughput-8b-nvfp4-bal0-h200.json): the
#      default's cold run (Triton compiles) passed its 170 s limit, so the limits below are longer.
#   4) NVFP4 decode at few (request, KV head) pairs (0.47 of the ceiling at TP 2 x 10 requests = 40 pairs):
#      5 / 10 / 24 requests x 32K at GQA 8 with the bf16 tail, default vs the tail programs kept in the wave
#      (tw=1) vs half the warps with twice the tokens each (ppsm=8). And FP8 at B=1 x 128K (0.71 / 0.61 of
#      the ceiling at GQA 4 / 8, target 0.75): the default 64 splits make 512 programs for 396 resident slots
#      (132 SMs x 3 at 168 registers), a second wave 29% full; cap=49 is exactly one wave, cap=33 / 24 fewer.
#      And NVFP4 at 20 warps per SM (one tile a step, 96 registers) against the default 16.
#   (5, extend_triton at 128-row query blocks, ran in stop 24: no faster, extend-sweep-bm128-h200.*)
# Usage from the repo root: OUT=... COMMIT=<sha> STEPS="0" bash benchmarks/device_next.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
STEPS=" ${STEPS:-0 2 3 4} "
mkdir -p "$OUT"
if [[ $STEPS == *" 0 "* ]]; then
  timeout -k 5 240 python3 -m pytest -q tests/test_kernels_decode.py -k "group_over or gpu" \
    tests/test_kernels_decode_balanced.py > "$OUT/tests-decode.log" 2>&1
  echo "tests exit $?"; tail -3 "$OUT/tests-decode.log"
  mkdir -p "$OUT/kernels"
  timeout -k 5 300 python3 benchmarks/bench_kernels.py --out "$OUT/kernels" > "$OUT/kernels/kernels-h200.log" 2>&1
  echo "kernels exit $?"; tail -3 "$OUT/kernels/kernels-h200.log"
fi
if [[ $STEPS == *" 2 "* ]]; then
  timeout -k 5 150 python3 benchmarks/bench_engine.py --out "$OUT/profile" --part long --long-model smollm2-135m \
    --synthetic-prefill --long-input 600 --long-requests 256 --long-output 32 --profile-steps 2 \
    > "$OUT/profile.log" 2>&1
  echo "profile exit $?"; grep -v '^{' "$OUT/profile.log" | grep -v Warning | tail -6
fi
if [[ $STEPS == *" 3 "* ]]; then
  timeout -k 5 260 python3 benchmarks/bench_engine.py --out "$OUT/throughput" --part throughput \
    --throughput-models llama-3.1-8b > "$OUT/throughput.log" 2>&1
  echo "throughput exit $?"; grep -v '^{' "$OUT/throughput.log" | grep -v Warning | tail -6
  NIBBLEKV_DECODE_VARIANT=mma:bal=0 timeout -k 5 170 python3 benchmarks/bench_engine.py --out "$OUT/throughput-bal0" \
    --part throughput --throughput-models llama-3.1-8b --kv-dtypes nvfp4 > "$OUT/throughput-bal0.log" 2>&1
  echo "throughput bal=0 exit $?"; grep -v '^{' "$OUT/throughput-bal0.log" | grep -v Warning | tail -3
fi
if [[ $STEPS == *" 4 "* ]]; then
  timeout -k 5 170 python3 benchmarks/bench_decode_variants.py --out "$OUT/variants" --budget-s 130 --tail \
    --q-heads 64 --shapes 5x32768 10x32768 24x32768 \
    --variants nvfp4=mma nvfp4=mma:tw=1 nvfp4=mma:ppsm=8 nvfp4=mma:ppsm=8,tw=1 fp8_e4m3=tok > "$OUT/variants.log" 2>&1
  echo "variants exit $?"; grep -v "arn" "$OUT/variants.log" | tail -8
  # 20 one-warp programs per SM (96 registers, ~50 bytes of spills in sm_90 SASS) at one tile a step: more
  # warps to hide the dependency chains ncu showed (stop 24: 36% of cycles no warp eligible at 14 warps/SM)
  timeout -k 5 170 python3 benchmarks/bench_decode_variants.py --out "$OUT/ppsm20" --budget-s 130 --tail \
    --shapes 26x32768 8x32768 32x8192 1x131072 --variants nvfp4=mma nvfp4=mma:tpi=1,pf=0,ppsm=20 \
    nvfp4=mma:tpi=1,ppsm=20 > "$OUT/ppsm20.log" 2>&1
  echo "ppsm20 exit $?"; grep -v "arn" "$OUT/ppsm20.log" | tail -6
  for q in 64 32; do
    timeout -k 5 100 python3 benchmarks/bench_decode_variants.py --out "$OUT/fp8-b1-gqa$((q / 8))" --budget-s 80 \
      --q-heads $q --shapes 1x131072 2x131072 --variants fp8_e4m3=tok fp8_e4m3=tok:cap=49 fp8_e4m3=tok:cap=33 \
      fp8_e4m3=tok:cap=24 bf16=tok bf16=tok:cap=49 > "$OUT/fp8-b1-gqa$((q / 8)).log" 2>&1
    echo "fp8 B=1 gqa$((q / 8)) exit $?"; grep -v "arn" "$OUT/fp8-b1-gqa$((q / 8)).log" | tail -9
  done
fi
