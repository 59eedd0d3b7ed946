#!/bin/bash
# Stop 37: decode_mma's page addresses as one IMAD.WIDE.U32 per pointer (_page_addr) against the tree before
# (38f61d4), one machine, one call, two processes a tree, alternating old/new/old/new per head shape; the new
# tree also times variant option l2=1 (an L2 prefetch of the next step's tiles mid-step; run at 394385f,
# dropped after it: no gain). Each bench_decode_variants run checks the kernel against decode_ref on the GPU
# before it times it.
# Usage from the repo root, with the old tree unpacked as an untracked folder first:
#   mkdir -p ab_old && git archive 38f61d4 nibblekv | tar -x -C ab_old
#   OUT=... COMMIT=<sha> bash benchmarks/device/s37.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
run() {  # $1 = tag, $2 = tree (old|new), rest = bench_decode_variants args
  local tag=$1 tree=$2; shift 2
  local pp=. vs="nvfp4=mma nvfp4=mma:l2=1"; [ "$tree" = old ] && pp=ab_old:. && vs=nvfp4=mma
  # shellcheck disable=SC2086
  PYTHONPATH=$pp timeout -k 5 ${T_AB:-60} python3 benchmarks/bench_decode_variants.py --out "$OUT/x" \
    --variants $vs "$@" > "$OUT/x.log" 2>&1
  echo "== $tag $tree exit $?"; grep -E "rel_rms|^ *nvfp4|frac" "$OUT/x.log" | grep -v "^dtype" | tail -8
  cat "$OUT/x.log" >> "$OUT/$tag.log"
  python3 - "$OUT/x/decode-variants.json" "$OUT/$tag.json" "$tree" <<'PY' 2>/dev/null
import json, os, sys
src, dst, tree = sys.argv[1:]
rows = json.load(open(src))
acc = json.load(open(dst)) if os.path.exists(dst) else []
acc.append({"tree": tree, "result": rows})
json.dump(acc, open(dst, "w"), indent=1)
PY
  rm -rf "$OUT/x" "$OUT/x.log"
}
for i in 1 2; do
  run pageaddr-gqa4-h200 old --shapes 8x32768 64x32768 32x8192 1x131072 128x8192
  run pageaddr-gqa4-h200 new --shapes 8x32768 64x32768 32x8192 1x131072 128x8192
done
for i in 1 2; do
  run pageaddr-d64-h200 old --head-dim 64 --shapes 8x32768 64x8192 64x32768
  run pageaddr-d64-h200 new --head-dim 64 --shapes 8x32768 64x8192 64x32768
done
run pageaddr-gqa8-h200 old --q-heads 64 --shapes 8x32768 32x8192 64x32768
run pageaddr-gqa8-h200 new --q-heads 64 --shapes 8x32768 32x8192 64x32768
ls "$OUT"
