#!/bin/bash
# H200: Nsight Compute on the decode kernels (stall reasons, issue slots, memory throughput) at the shapes
# where NVFP4 decode misses issue 3's targets, beside FP8 at the same shape; then the GPU tests stop 23 left
# unrun (decode GQA groups over 16, the balanced default). At ec8873f it also ran extend at 128-row query
# blocks (then benchmarks/device/next.sh step 5: extend-sweep-bm128-h200.*).
# Usage from the repo root: OUT=... COMMIT=<sha> bash benchmarks/device/ncu.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 COMMIT=${COMMIT:-unknown}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/ncu"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || ls /usr/local/cuda/bin/ncu)
echo "ncu: $NCU"
timeout -k 5 200 "$NCU" --profile-from-start off --clock-control none --set full --import-source no \
  -o "$OUT/ncu/decode" -f python3 benchmarks/ncu_decode.py --shapes nvfp4:26x32768 fp8_e4m3:26x32768 \
  nvfp4:32x8192 nvfp4:32x8192:32:mma:bal=0 nvfp4:8x32768:64 > "$OUT/ncu/ncu.log" 2>&1
echo "ncu exit $?"; tail -5 "$OUT/ncu/ncu.log"
"$NCU" -i "$OUT/ncu/decode.ncu-rep" --page details > "$OUT/ncu/details.txt" 2>&1
"$NCU" -i "$OUT/ncu/decode.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/source.csv" 2>&1
"$NCU" -i "$OUT/ncu/decode.ncu-rep" --page raw --csv > "$OUT/ncu/raw.csv" 2>&1
ls -la "$OUT/ncu"
timeout -k 5 150 python3 -m pytest -q tests/test_kernels_decode.py -k "group_over or gpu" \
  tests/test_kernels_decode_balanced.py > "$OUT/tests-decode.log" 2>&1
echo "decode tests exit $?"; tail -3 "$OUT/tests-decode.log"
