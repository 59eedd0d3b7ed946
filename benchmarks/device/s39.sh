#!/bin/bash
# Stop 39: decode_mma's register budget. At ppsm=16 (128 registers) ptxas sinks the next tile's loads to the
# loop's last ~90 of ~780 SASS and moves one 64-bit value through local memory; at ppsm=14 (144) / 12 (168)
# it issues them ~200 / ~300 SASS before the end, with no spill at head_dim 64. Variants side by side, one
# call: head_dim 64 (plus the tree before the sm order, f3bc8c2, for the regression), GQA 4 and GQA 8 at
# head_dim 128.
# Usage from the repo root, with the old tree unpacked as an untracked folder first:
#   mkdir -p ab_old && git archive f3bc8c2 nibblekv | tar -x -C ab_old
#   OUT=... COMMIT=<sha> bash benchmarks/device/s39.sh
export PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
run() {  # $1 = tag, $2 = tree (old|new), rest = bench_decode_variants args
  local tag=$1 tree=$2; shift 2
  local pp=.; [ "$tree" = old ] && pp=ab_old:.
  # shellcheck disable=SC2086
  PYTHONPATH=$pp timeout -k 5 ${T_AB:-100} python3 benchmarks/bench_decode_variants.py --out "$OUT/x" "$@" \
    > "$OUT/x.log" 2>&1
  echo "== $tag $tree exit $?"
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
D64="--head-dim 64 --shapes 8x32768 64x8192 64x32768"
V="nvfp4=mma nvfp4=mma:ppsm=14 nvfp4=mma:ppsm=12"
run regs-d64-h200 new $D64 --variants $V nvfp4=mma:pf=0
run regs-d64-h200 old $D64 --variants nvfp4=mma
run regs-gqa4-h200 new --shapes 8x32768 26x32768 64x32768 32x8192 1x131072 --variants $V
run regs-gqa8-h200 new --q-heads 64 --shapes 8x32768 32x8192 64x32768 --variants nvfp4=mma nvfp4=mma:ppsm=14
run regs-d64-h200 new $D64 --variants nvfp4=mma:ppsm=12 nvfp4=mma:ppsm=14 nvfp4=mma
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/regs-*.json")):
    for run in json.load(open(f)):
        rows = [r for r in run["result"].get("rows", []) if r.get("kv_dtype") == "nvfp4"]
        cells = [f"{r.get('variant', '?')}:B{r['batch']}x{r['context'] // 1024}K:{r['frac_of_ceiling']:.3f}"
                 for r in rows]
        print(f.split("/")[-1], run["tree"], " ".join(cells))
PY
