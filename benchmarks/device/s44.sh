#!/bin/bash
# Next stop's first call (written at stop 43): extend_decode's step 2 without the main-pool pass (5b1adca:
# extend_triton with merge no longer reads prefix_lens -- no zeros fill launch -- and loads the merge partial
# first, beside the own keys) and fold_q (opt-in: decode_mma16 reads Q itself, no gather launch; rows
# "fold"), both untimed at stop 43 (device time spent). The 4-token NVFP4 chunk sat at 0.601 /
# 0.596 of the ceiling in stop 43's two full runs. 1) GPU tests of those paths; 2) A/B against 7a81b5f, old /
# new / old / new, per-kernel breakdown; 3) the kernel table if the new tree wins (run bench_kernels after).
# Usage from the repo root, the old tree unpacked as an untracked folder first (delete it after the call):
#   mkdir -p ab_old && git archive 7a81b5f nibblekv | tar -x -C ab_old
#   COMMIT=<sha> OUT=... bash benchmarks/device/s44.sh   (~8 min)
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PYTHONPATH=. TEST_TIMEOUT=${TEST_TIMEOUT:-150} OUT=$OUT TEST_FILES="tests/test_kernels_extend_decode.py \
  tests/test_kernels_decode.py::test_decode_pdl tests/test_kernels_extend.py" \
  bash benchmarks/device/tests.sh | head -6
S="--shapes 64x8192x4 64x8192x2 32x32768x4 --configs 0:0:0:0:0:0:0:1"
for tree in old new old new; do
  pp=.; [ "$tree" = old ] && pp=ab_old:.
  mkdir -p "$OUT/$tree"
  opts=(""); [ "$tree" = new ] && opts=(nofold fold)  # NOTE: fold_q became the default at stop 44
  # shellcheck disable=SC2086
  PYTHONPATH=$pp timeout -k 5 "${T_AB:-90}" python3 benchmarks/bench_extend.py $S --decode-opts "${opts[@]}" \
    --out "$OUT/x" > "$OUT/x.log" 2>&1
  echo "== $tree exit $?"; grep -E "^extend_decode nvfp4" "$OUT/x.log" | cut -c1-160
  cat "$OUT/x.log" >> "$OUT/$tree/extend.log"; mv "$OUT/x/extend-sweep.json" "$OUT/$tree/extend-$RANDOM.json"
done
mkdir -p "$OUT/breakdown"
# shellcheck disable=SC2086
PYTHONPATH=. timeout -k 5 150 python3 benchmarks/bench_extend.py $S --breakdown --decode-opts "" fold \
  --out "$OUT/breakdown" > "$OUT/breakdown/extend.log" 2>&1
echo "breakdown exit $?"; grep -E "^extend_decode nvfp4" "$OUT/breakdown/extend.log" | cut -c60-400
