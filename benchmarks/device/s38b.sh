#!/bin/bash
# Stop 38: the pool's NVFP4 words in sm order (decode_mma: 6 masks + 5 IMAD shifts a word) against the tree
# before (f3bc8c2: standard order, E4M3 bytes + cvt.rn.f16x2.e4m3x2), one machine, one call, two processes a
# tree, alternating old/new per head shape. Each bench_decode_variants run checks the kernel against its own
# tree's decode_ref on the GPU before it times it.
# Usage from the repo root, with the old tree unpacked as an untracked folder first:
#   mkdir -p ab_old && git archive f3bc8c2 nibblekv | tar -x -C ab_old
#   OUT=... COMMIT=<sha> bash benchmarks/device/s38b.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
run() {  # $1 = tag, $2 = tree (old|new), rest = bench_decode_variants args
  local tag=$1 tree=$2; shift 2
  local pp=.; [ "$tree" = old ] && pp=ab_old:.
  # shellcheck disable=SC2086
  PYTHONPATH=$pp timeout -k 5 ${T_AB:-60} python3 benchmarks/bench_decode_variants.py --out "$OUT/x" \
    --variants nvfp4=mma "$@" > "$OUT/x.log" 2>&1
  echo "== $tag $tree exit $?"
  grep -E "rel_rms|^ *nvfp4" "$OUT/x.log" | grep -v "^dtype" | cut -c1-70 | tail -3
  cat "$OUT/x.log" >> "$OUT/$tag.log"
  python3 - "$OUT/x/decode-variants.json" "$OUT/$tag.json" "$tree" <<'PY' 2>/dev/null
import json, os, sys
src, dst, tree = sys.argv[1:]
acc = json.load(open(dst)) if os.path.exists(dst) else []
acc.append({"tree": tree, "result": json.load(open(src))})
json.dump(acc, open(dst, "w"), indent=1)
PY
  rm -rf "$OUT/x" "$OUT/x.log"
}
for i in 1 2; do
  run sm-gqa4-h200 old --shapes 8x32768 26x32768 64x32768 32x8192 1x131072 128x8192
  run sm-gqa4-h200 new --shapes 8x32768 26x32768 64x32768 32x8192 1x131072 128x8192
done
run sm-d64-h200 old --head-dim 64 --shapes 8x32768 64x8192 64x32768
run sm-d64-h200 new --head-dim 64 --shapes 8x32768 64x8192 64x32768
run sm-gqa8-h200 old --q-heads 64 --shapes 8x32768 32x8192 64x32768
run sm-gqa8-h200 new --q-heads 64 --shapes 8x32768 32x8192 64x32768
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/sm-*.json")):
    for run in json.load(open(f)):
        rows = [r for r in run["result"].get("rows", []) if r.get("kv_dtype") == "nvfp4"]
        cells = [f"B{r['batch']}x{r['context'] // 1024}K:{r['frac_of_ceiling']:.3f}" for r in rows]
        print(f.split("/")[-1], run["tree"], " ".join(cells))
PY
ls "$OUT"
