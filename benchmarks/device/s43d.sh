#!/bin/bash
# This stop's fourth call: extend_decode with programmatic dependent launch (EXTEND_PDL, on in this tree):
# the prefix decode, its combine step (which now releases the next PDL kernel before it waits) and step 2
# (own keys + merge; it waits for the combine step only before the merge) -- so step 2's own-key pass runs
# beside the combine step. 1) GPU tests of those paths; 2) extend A/B, pdl=0 vs the default, two rounds in
# reverse order; 3) issue 3's one-run kernel table at this tree.
# Usage from the repo root: COMMIT=<sha> OUT=... bash benchmarks/device/s43d.sh   (~7 min)
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/ab1" "$OUT/ab2" "$OUT/kernels"
TEST_TIMEOUT=${TEST_TIMEOUT:-150} OUT=$OUT TEST_FILES="tests/test_kernels_extend_decode.py \
  tests/test_kernels_decode.py::test_decode_pdl tests/test_kernels_extend.py" \
  bash benchmarks/device/tests.sh | head -6
S="--shapes 64x8192x4 64x8192x2 32x32768x4 64x8192x8 --configs 0:0:0:0:0:0:0:1"
# shellcheck disable=SC2086
timeout -k 5 100 python3 benchmarks/bench_extend.py $S --breakdown --decode-opts pdl=0 "" --out "$OUT/ab1" \
  > "$OUT/ab1/extend.log" 2>&1
# shellcheck disable=SC2086
timeout -k 5 80 python3 benchmarks/bench_extend.py $S --decode-opts "" pdl=0 --out "$OUT/ab2" \
  > "$OUT/ab2/extend.log" 2>&1
grep -hE "^extend_decode" "$OUT/ab1/extend.log" "$OUT/ab2/extend.log" | cut -c1-150
COMMIT=${COMMIT:-unknown} timeout -k 5 "${T_KERNELS:-280}" python3 benchmarks/bench_kernels.py \
  --out "$OUT/kernels" > "$OUT/kernels/kernels.log" 2>&1
echo "kernels exit $?"; tail -3 "$OUT/kernels/kernels.log"
