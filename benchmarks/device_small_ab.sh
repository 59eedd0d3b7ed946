export PYTHONPATH=. PYTHONUNBUFFERED=1
E="python3 benchmarks/bench_engine.py --part long --synthetic-prefill --long-input 3072 --long-requests 1 --long-output 48 --profile-steps 3 --profile-top 12"
run() { name=$1; ev=$2; shift 2; mkdir -p $OUT/$name; env $ev $E "$@" --out $OUT/$name > $OUT/$name/log 2>&1;
  python3 -c "
import json,sys
d=json.load(open('$OUT/$name/bench_engine.json'))
for r in d['rows']:
    ks={k['kernel'][:22]:k['ms_per_step'] for k in r['top_kernels'] if any(x in k['kernel'] for x in ('decode','combine','rope','store'))}
    print('$name', r['kv_dtype'], r['running_requests'], 'step', r['step_ms'], 'busy', r['gpu_busy_ms_per_step'], ks)
" || tail -5 $OUT/$name/log; }
run default X=1 --kv-dtypes nvfp4
run seq NIBBLEKV_SIDE_STREAM=0 --kv-dtypes nvfp4
run notail X=1 --kv-dtypes nvfp4 fp8_e4m3 --kv-recent-window 0
run tok NIBBLEKV_DECODE_VARIANT=tok --kv-dtypes nvfp4
run fp8 X=1 --kv-dtypes fp8_e4m3
