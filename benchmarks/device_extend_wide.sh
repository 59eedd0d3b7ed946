#!/bin/bash
# One H200 call (~4 min) for the extend paths of stop 22 (built and interpreter-tested, not yet timed):
#   1) GPU tests of extend_decode (FP8 through decode_tok is the default since stop 22; groups of up to 64
#      decode_tok columns) and of the overlap schedule with the host tier (allowed since stop 22);
#   2) bench_extend at every SHAPES row: extend_triton (DEC=0), extend_decode (1), NVFP4 wide chunks through
#      one decode_tok group of <= 16 columns (2) and of <= 64 columns (3: a 16-token chunk at GQA 4, FP8 too).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device_extend_wide.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/extend"
timeout -k 5 150 python3 -m pytest -q tests/test_kernels_extend_decode.py \
  tests/test_engine_gpu.py::test_overlap_schedule_with_the_host_tier_equals_sync_on_gpu > "$OUT/tests-extend.log" 2>&1
echo "pytest exit $?"; tail -2 "$OUT/tests-extend.log"
timeout -k 5 240 python3 benchmarks/bench_extend.py --out "$OUT/extend" \
  --configs 0:0 0:0:0:0:0:0:0:1 0:0:0:0:0:0:0:2 0:0:0:0:0:0:0:3 > "$OUT/extend/log" 2>&1
echo "extend exit $?"; grep -v "arn" "$OUT/extend/log" | tail -40
