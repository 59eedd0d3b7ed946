# Shared by the device scripts (sourced, not run): the GPU's clocks beside the results, the carried wheels
# (fla-core for the hybrid models; the device has no package registry) and one benchmark run under a timeout.

# gpu_info: nvidia-smi's name, clocks, power and memory into $OUT/gpu.txt
gpu_info() {
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,memory.used --format=csv \
        >"$OUT/gpu.txt" 2>&1
}

# carried_wheels: install .whl/*.whl into /tmp/site unless fla-core imports already; put it on PYTHONPATH
carried_wheels() {
    if ! python3 -c "import fla" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl
    fi
    export PYTHONPATH=.:/tmp/site
}

# run_bench SECONDS LOG TAIL SCRIPT [ARGS...]: python3 SCRIPT ARGS under a timeout, its output into LOG; prints
# its exit status and LOG's last TAIL lines; returns the exit status
run_bench() {
    local seconds=$1 log=$2 lines=$3 script=$4
    shift 4
    timeout -k 10 "$seconds" python3 "$script" "$@" >"$log" 2>&1
    local rc=$?
    echo "$(basename "$script" .py): exit $rc"
    tail -n "$lines" "$log"
    return $rc
}
