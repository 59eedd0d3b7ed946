export PYTHONPATH=. PYTHONUNBUFFERED=1
timeout -k 5 100 python3 -m pytest -q tests/test_kernels_write.py > $OUT/tests.log 2>&1; echo "tests exit $?"; tail -2 $OUT/tests.log
timeout -k 5 200 python3 benchmarks/bench_small_ab.py --out "$OUT" --requests 1 2 8 --only fp8 "fp8 window0" nvfp4 "nvfp4 no4o6" "nvfp4 window0" > "$OUT/small-ab.log" 2>&1
echo "small-ab exit $?"; grep -v "^{\|arn" "$OUT/small-ab.log" | tail -18
