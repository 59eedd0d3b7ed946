#!/bin/bash
# Shared by the device A/B scripts (s38b.sh, s39.sh): source it, then call
#   ab_run TAG TREE ARGS...  one bench_decode_variants.py process; TREE "old" runs the untracked ab_old/
#                            tree (mkdir -p ab_old && git archive <sha> nibblekv | tar -x -C ab_old), "new"
#                            this one; its log is appended to $OUT/TAG.log, its JSON to the list $OUT/TAG.json
#   ab_summary GLOB          one line per process: each NVFP4 row's variant, shape, fraction of the ceiling
# ($T_AB: seconds a process, default 100.)
ab_run() {
  local tag=$1 tree=$2; shift 2
  local pp=.; [ "$tree" = old ] && pp=ab_old:.
  # shellcheck disable=SC2086
  PYTHONPATH=$pp timeout -k 5 ${T_AB:-100} python3 benchmarks/bench_decode_variants.py --out "$OUT/x" "$@" \
    > "$OUT/x.log" 2>&1
  echo "== $tag $tree exit $?"
  grep -E "rel_rms" "$OUT/x.log" | cut -c1-90 | tail -4
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

ab_summary() {
  python3 - "$1" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1])):
    for run in json.load(open(f)):
        res = run["result"]
        ceil = max(res.get("ceiling_probes", {}).values() or [1.0])  # NOTE: rows carry tbps, not the fraction
        rows = [r for r in res.get("rows", []) if r.get("kv_dtype") == "nvfp4"]
        cells = [f"{r.get('variant', '?')}:B{r['batch']}x{r['context'] // 1024}K:"
                 f"{r.get('frac_of_ceiling', r['tbps'] / ceil):.3f}" for r in rows]
        print(f.split("/")[-1], run["tree"], " ".join(cells))
PY
}
