#!/bin/bash
# Stop 44's second call: s44b.sh (the L2 prefetch in the 8-column kernels, two rounds in reverse order) and
# four more extend_decode rounds with / without fold_q -- at stop 44's first call (s44-h200/) fold_q saved
# ~2 us at 64 x 8K x 4 in three of three runs but was mixed at 32 x 32K x 4 (+3.4 / +13.4 / -7.1 us).
# Usage from the repo root: OUT=... bash benchmarks/device/s44c.sh   (~10 min)
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/fold"
S="--shapes 64x8192x4 32x32768x4 --configs 0:0:0:0:0:0:0:1"
for first in fold plain fold plain; do
  opts=(fold nofold); [ "$first" = plain ] && opts=(nofold fold)
  # shellcheck disable=SC2086
  PYTHONPATH=. timeout -k 5 90 python3 benchmarks/bench_extend.py $S --decode-opts "${opts[@]}" \
    --out "$OUT/x" > "$OUT/x.log" 2>&1
  echo "== fold round ($first first) exit $?"; grep -E "^extend_decode nvfp4" "$OUT/x.log" | cut -c1-160
  cat "$OUT/x.log" >> "$OUT/fold/extend.log"; rm -rf "$OUT/x" "$OUT/x.log"
done
OUT=$OUT bash benchmarks/device/s44b.sh
