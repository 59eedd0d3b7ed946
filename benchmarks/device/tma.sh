#!/bin/bash
# Stop 28: decode_mma's tiles staged through shared memory by bulk copies (variant option tma = ring stages,
# nibblekv/kernels/_tma.py) against the register path, one H200 call (~6 min). GPU tests first; the timing
# only if they pass (a wrong barrier phase would hang, not fail).
# Usage from the repo root: OUT=... bash benchmarks/device/tma.sh   (V= overrides the variant list)
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout -k 5 200 python3 -m pytest -q -x tests/test_kernels_decode.py -k "test_decode_mma_tma or test_decode_pdl" \
  > "$OUT/gpu-tests-tma.log" 2>&1
rc=$?
echo "gpu tests exit $rc"; tail -3 "$OUT/gpu-tests-tma.log"
[[ $rc == 0 ]] || exit 1
V=${V:-"nvfp4=mma nvfp4=mma:tma=4 nvfp4=mma:tma=2,tpi=1 nvfp4=mma:tma=4,tpi=1 nvfp4=mma:tma=5,tpi=1"}
V="$V ${V2:-nvfp4=mma:tma=3,tpi=1 fp8_e4m3=tok}"
SHAPES=${SHAPES:-64x32768 8x32768 32x8192 1x131072 26x32768}
timeout -k 5 "${BENCH_S:-330}" python3 benchmarks/bench_decode_variants.py --out "$OUT/v" --budget-s 260 --tail \
  --shapes $SHAPES --variants $V > "$OUT/decode-variants-tma.log" 2>&1
echo "bench exit $?"
cp "$OUT/v/decode-variants.json" "$OUT/decode-variants-tma-h200.json" 2>/dev/null; rm -rf "$OUT/v"
tail -14 "$OUT/decode-variants-tma.log"
