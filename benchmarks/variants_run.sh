#!/bin/bash
# Sourced by the device_s30*.sh scripts: run NAME SECONDS ARGS... = one bench_decode_variants.py call (ARGS
# passed on, e.g. --breakdown --tail --shapes ... --variants ...) -> $OUT/decode-variants-NAME-h200.{json,log},
# then the log's summary table.
run() {
  local name=$1 secs=$2; shift 2
  timeout -k 5 "$secs" python3 benchmarks/bench_decode_variants.py --out "$OUT/$name" --budget-s $((secs - 40)) \
    "$@" > "$OUT/decode-variants-$name-h200.log" 2>&1
  echo "$name exit $?"
  cp "$OUT/$name/decode-variants.json" "$OUT/decode-variants-$name-h200.json" 2>/dev/null; rm -rf "$OUT/$name"
  grep -A30 "^dtype" "$OUT/decode-variants-$name-h200.log" | grep -v "^$" | head -30
}
