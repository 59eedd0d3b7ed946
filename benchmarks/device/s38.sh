#!/bin/bash
# Stop 38: decode_mma reading NVFP4 data in sm order (variant option cv=4: 6 masks + 5 IMAD shifts a word, no
# cvt.rn.f16x2.e4m3x2; nibblekv/formats/sm_words.py) against the default (E4M3 bytes + cvt), one machine,
# one call, both orders per head shape. Each bench_decode_variants run checks every variant against
# decode_ref on the GPU first (cv=4 on an sm copy of the check pool; timed pools are random bytes).
# Ran at 99f3cf2 (cv=4 = the rotation order, shf-s38-h200/) and e05b8ec (cv=4 = sm order); the option is
# gone since the pool itself holds sm words (s38b.sh is the A/B of that). Usage at those commits:
#   OUT=... COMMIT=<sha> bash benchmarks/device/s38.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
run() {  # $1 = tag, rest = bench_decode_variants args
  local tag=$1; shift
  # shellcheck disable=SC2086
  PYTHONPATH=. timeout -k 5 ${T_AB:-75} python3 benchmarks/bench_decode_variants.py --out "$OUT/x" "$@" \
    > "$OUT/x.log" 2>&1
  echo "== $tag exit $?"; grep -E "rel_rms|^ *nvfp4" "$OUT/x.log" | grep -v "^dtype" | tail -6
  cat "$OUT/x.log" >> "$OUT/$tag.log"
  python3 - "$OUT/x/decode-variants.json" "$OUT/$tag.json" <<'PY' 2>/dev/null
import json, os, sys
src, dst = sys.argv[1:]
acc = json.load(open(dst)) if os.path.exists(dst) else []
acc.append(json.load(open(src)))
json.dump(acc, open(dst, "w"), indent=1)
PY
  rm -rf "$OUT/x" "$OUT/x.log"
}
G4="8x32768 26x32768 64x32768 32x8192 1x131072 128x8192"
run sm-gqa4-h200 --variants nvfp4=mma nvfp4=mma:cv=4 --shapes $G4
run sm-gqa4-h200 --variants nvfp4=mma:cv=4 nvfp4=mma --shapes $G4
run sm-d64-h200 --head-dim 64 --variants nvfp4=mma nvfp4=mma:cv=4 --shapes 8x32768 64x8192 64x32768
run sm-d64-h200 --head-dim 64 --variants nvfp4=mma:cv=4 nvfp4=mma --shapes 8x32768 64x8192 64x32768
run sm-gqa8-h200 --q-heads 64 --variants nvfp4=mma nvfp4=mma:cv=4 nvfp4=mma:cv=3 \
  --shapes 8x32768 32x8192 64x32768
ls "$OUT"
