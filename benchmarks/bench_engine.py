"""Engine benchmarks for the GPU: offline throughput and long-context decode, per KV dtype.

* throughput: N random requests (input and output lengths uniform in ranges), SmolLM2-shaped and
  Llama-3.1-8B-shaped dummy models, for each KV dtype.
* long: Llama-3.1-8B dummy, 32K in / 1024 out. ``matched``: every dtype runs as many requests as bf16
  can hold; ``capacity``: each dtype runs as many as its own pool holds. Reports the decode throughput
  at full concurrency, the median decode step and its memory floor (weights + KV bytes the step must
  read, over the read bandwidth measured in the same run).

    PYTHONPATH=. python benchmarks/bench_engine.py                  # everything, on the GPU
    PYTHONPATH=. python benchmarks/bench_engine.py --part long --synthetic-prefill
    PYTHONPATH=. python benchmarks/bench_engine.py --smoke          # tiny CPU run of the same code

JSON goes to ``$OUT/bench_engine.json`` (or ``--out``); a table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_timing import SharedModel, decode_run, free_memory, read_bandwidth, rotating_last, sync

from nibblekv.config import QUANTIZATIONS, EngineConfig
from nibblekv.engine.engine import Engine
from nibblekv.engine.gc_heap import frozen_heap
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.engine.setup import resident_capacity
from nibblekv.model import load_model
from nibblekv.model.fp8 import QuantMethod

KV_DTYPES = ("bf16", "fp8_e4m3", "nvfp4")
# A 2-layer Llama for --smoke (CPU, reference kernels).
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 320, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "bos_token_id": 256, "eos_token_id": 257,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("throughput", "long", "all"), default="all")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (checks the code path)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    p.add_argument("--kv-dtypes", nargs="+", default=list(KV_DTYPES))
    p.add_argument("--throughput-models", nargs="+", default=["smollm2-135m", "llama-3.1-8b"])
    p.add_argument("--long-model", default="llama-3.1-8b")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--input-range", type=int, nargs=2, default=[100, 1024])
    p.add_argument("--output-range", type=int, nargs=2, default=[100, 1024])
    p.add_argument("--long-input", type=int, default=32768)
    p.add_argument("--long-output", type=int, default=1024)
    p.add_argument("--long-requests", type=int, nargs="+", default=None,
                   help="long part: run these request counts instead of matched/capacity")  # fmt: skip
    p.add_argument("--mem-fraction-static", type=float, default=0.88)
    p.add_argument("--max-running-requests", type=int, default=256, help="throughput part")
    p.add_argument("--throughput-repeats", type=int, default=1, help="throughput part: time the workload "
                   "this many times on one engine, report the fastest (the first includes Triton's compiles)")
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--kv-recent-window", type=int, default=64)
    p.add_argument("--synthetic-prefill", action="store_true", help="long part: allocate the prompts' KV pages "
                   "without computing them (decode timing does not depend on the cached values)")  # fmt: skip
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="default: the engine's (every batch)")
    ov = p.add_mutually_exclusive_group()
    ov.add_argument("--enable-overlap-schedule", dest="overlap", action="store_const", const=True, default=None,
                    help="schedule decode step N+1 while step N runs (engine/overlap.py; default: the "
                    "engine's, on for one CUDA GPU)")  # fmt: skip
    ov.add_argument("--disable-overlap-schedule", dest="overlap", action="store_const", const=False)
    p.add_argument("--profile-top", type=int, default=12, help="kernels listed per profiled run")
    p.add_argument("--profile-steps", type=int, default=0, help="long part: profile this many decode steps "
                   "(after 3) with the torch profiler and report the top GPU kernels")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None,
                   help="fp8: every model's linear layers in FP8 (per-channel weights, per-token activations)")
    p.add_argument("--json-model-override-args", default=None, metavar="JSON",
                   help='merged into every model\'s config, e.g. \'{"num_hidden_layers": 4}\' '
                   "(a few layers of a big shape)")
    args = p.parse_args(argv)
    if args.smoke:
        args.num_requests, args.input_range, args.output_range = 6, [8, 40], [4, 12]
        args.long_input, args.long_output, args.chunked_prefill_size = 96, 6, 32
        args.kv_recent_window, args.max_running_requests = 16, 8
    return args


def base_config(args: argparse.Namespace, model: str) -> EngineConfig:
    common: dict[str, Any] = {
        "load_format": "dummy", "seed": args.seed, "chunked_prefill_size": args.chunked_prefill_size,
        "kv_recent_window": args.kv_recent_window, "disable_cuda_graph": args.disable_cuda_graph,
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "decode_log_interval": 0, "enable_overlap_schedule": args.overlap,
        "json_model_override_args": args.json_model_override_args, "quantization": args.quantization,
    }  # fmt: skip
    if args.smoke:  # NOTE: on CPU the pool is sized from a byte budget, like the GPU's fraction rule
        return EngineConfig(model=model, device="cpu", mem_budget_gib=1e-3, **common)
    return EngineConfig(model=model, device="cuda", mem_fraction_static=args.mem_fraction_static, **common)


def load(args: argparse.Namespace, name: str) -> SharedModel[tuple[Any, Any]]:
    """A dummy (random-weight) model for the engines of every KV dtype; with --smoke the tiny config whatever
    ``name`` says."""
    if args.smoke:
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(json.dumps(TINY))
        name = str(path)
    device = "cpu" if args.smoke else "cuda"
    overrides = base_config(args, name).model_overrides()
    quant = QuantMethod(args.quantization) if args.quantization else None
    return SharedModel(lambda rotation: load_model(
        name, load_format="dummy", device=device, seed=args.seed, overrides=overrides, quantization=quant,
        kv_rotation=rotation,
    ))  # fmt: skip


def random_prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, min(vocab, 32000)) for _ in range(n)]


# ---- throughput -----------------------------------------------------------------------------------
def bench_throughput(args: argparse.Namespace, model_name: str) -> list[dict[str, Any]]:
    models = load(args, model_name)
    vocab = models.current[0].config.vocab_size
    rng = random.Random(args.seed)
    lens = [
        (rng.randint(*args.input_range), rng.randint(*args.output_range)) for _ in range(args.num_requests)
    ]
    prompts = [random_prompt(rng, i, vocab) for i, _ in lens]
    params = [SamplingParams(temperature=0, max_new_tokens=o, ignore_eos=True) for _, o in lens]
    rows = []
    for kv in rotating_last(args.kv_dtypes):
        cfg = replace(
            base_config(args, model_name), kv_cache_dtype=kv, max_running_requests=args.max_running_requests
        )
        engine = Engine(cfg, loaded=models.get(cfg))
        sync()
        warm = warm_up(engine, vocab, args)
        runs, compiles, cached = [], [], []
        for _ in range(args.throughput_repeats):  # NOTE: later runs find every Triton build compiled
            # NOTE: each run starts from an empty prefix cache: a repeat of the same prompts would otherwise
            # skip their prefill (8B bf16: 14.55 -> 11.03 s, its prefill alone 3.6 s)
            engine.flush_cache()
            # frozen heap: as `nibblekv generate` / `serve` run (engine/gc_heap.py)
            with frozen_heap(), compile_log(compiles):
                t0 = time.perf_counter()
                outs = engine.generate(prompts, params)
                sync()
                runs.append(time.perf_counter() - t0)
            cached.append(sum(o.cached_tokens for o in outs))
        secs = min(runs)
        n_out = sum(o.completion_tokens for o in outs)
        n_in = sum(o.prompt_tokens for o in outs)
        assert engine.pool.all_free() and n_out == sum(o for _, o in lens)
        prefill = prefill_only(engine, prompts)
        rows.append({
            "bench": "throughput", "model": model_name + (" (smoke: tiny)" if args.smoke else ""), "kv_dtype": kv, "num_requests": len(prompts),
            "weights": args.quantization or "bf16",
            "input_tokens": n_in, "output_tokens": n_out, "seconds": round(secs, 3),
            "output_tok_s": round(n_out / secs, 1), "total_tok_s": round((n_in + n_out) / secs, 1),
            "max_total_num_tokens": engine.max_total_num_tokens, "preemptions": engine.scheduler.num_preemptions,
            "warmup_s": round(warm, 3), "prefill_only_s": round(prefill, 3),
            "seconds_runs": [round(x, 3) for x in runs], "cached_prompt_tokens_runs": cached,
            # the Triton builds the timed runs compiled (warm_up missed them): count, then each one's key
            "compiles_in_runs": len(compiles), "compiled": compiles[:64],
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        del engine, outs
        free_memory()
    return rows


@contextlib.contextmanager
def compile_log(into: list[str]) -> Iterator[None]:
    """Append the signature of every Triton build compiled inside the block to ``into`` (Triton's
    ``jit_cache_hook``: called on each in-memory cache miss, before the compile)."""
    try:
        from triton import knobs
    except ImportError:  # no Triton: nothing compiles
        yield
        return

    def hook(*, repr: str, key: Any, compile: dict[str, Any], **_: Any) -> bool:
        # the kernel's name, its cache key, the attributes (which arguments are 16-divisible / 16-byte
        # aligned) and the constexprs: what differs between two builds of one kernel
        parts = (repr.split("[")[0], key, compile.get("configs"), compile.get("constants"))
        into.append(" | ".join(str(p) for p in parts)[:3000])
        return False  # go on and compile

    old, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = old


def warm_up(engine: Engine, vocab: int, args: argparse.Namespace) -> float:
    """Untimed: a small batch over the input range (prefill, extend, decode and tail demotion at several
    sizes), so Triton's first-use compiles stay out of the timed run -- they are per process, not per
    request (nano-vllm's bench warms up the same way). Returns its seconds."""
    rng = random.Random(args.seed + 1)
    lo, hi = args.input_range
    lens = [lo + (hi - lo) * i // 15 for i in range(16)]
    prompts = [random_prompt(rng, n, vocab) for n in lens]
    params = [SamplingParams(temperature=0, max_new_tokens=8 + 8 * (i % 4), ignore_eos=True) for i in range(16)]
    t0 = time.perf_counter()
    engine.generate(prompts, params)
    sync()
    return time.perf_counter() - t0  # NOTE: bench_throughput flushes the prefix cache before each timed run


def prefill_only(engine: Engine, prompts: list[list[int]]) -> float:
    """Seconds for the same prompts with one output token each (the cache flushed first, so every prompt
    is prefilled again): the prefill share of the timed run, apart from its decode steps."""
    engine.flush_cache()
    params = SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    engine.generate(prompts, params)
    sync()
    return time.perf_counter() - t0


# ---- long context ---------------------------------------------------------------------------------
def capacity_requests(cfg: EngineConfig, model: Any, per_request: int) -> int:
    """The most requests of ``per_request`` tokens the pool holds at once (the engine's own sizing)."""
    n = resident_capacity(cfg, model, per_request, cfg.context_length or model.config.max_position_embeddings)
    if n == 0:
        raise ValueError(f"the KV pool cannot hold one request of {per_request} tokens")
    return n


def bench_long(args: argparse.Namespace) -> list[dict[str, Any]]:
    models = load(args, args.long_model)
    dev = models.current[0].device
    bandwidth = read_bandwidth(dev, 0.0625 if args.smoke else 4.0)
    page = EngineConfig().page_size
    per_request = (-(-(args.long_input + args.long_output) // page) + 1) * page
    cfg = replace(
        base_config(args, args.long_model), context_length=args.long_input + args.long_output + page
    )
    rng = random.Random(args.seed)
    vocab = models.current[0].config.vocab_size
    params = SamplingParams(temperature=0, max_new_tokens=args.long_output, ignore_eos=True)
    if args.long_requests:  # fixed batch sizes, e.g. the small batches of a low-concurrency server
        runs = [(f"requests={n}", n) for n in args.long_requests]
    else:
        bf16 = capacity_requests(replace(cfg, kv_cache_dtype="bf16"), models.current[0], per_request)
        runs = [("matched", bf16), ("capacity", 0)]
    rows = []
    for kv in rotating_last(args.kv_dtypes):
        for mode, fixed in runs:
            kv_cfg = replace(cfg, kv_cache_dtype=kv)
            loaded = models.get(kv_cfg)
            n = fixed or capacity_requests(kv_cfg, loaded[0], per_request)
            engine = Engine(replace(kv_cfg, max_running_requests=n), loaded=loaded)
            del loaded  # NOTE: the next get may reload: hold the model through the engine only
            prompts = [random_prompt(rng, args.long_input, vocab) for _ in range(n)]
            with frozen_heap():
                res = decode_run(
                    engine, prompts, params, args.synthetic_prefill, bandwidth, args.profile_steps, args.profile_top
                )
            assert engine.pool.all_free()
            rows.append({
                "bench": "long", "model": args.long_model + (" (smoke: tiny)" if args.smoke else ""), "kv_dtype": kv, "mode": mode, **res,
                "weights": args.quantization or "bf16",
                "max_total_num_tokens": engine.max_total_num_tokens, "input_len": args.long_input,
                "output_len": args.long_output, "read_bandwidth_gbs": round(bandwidth / 1e9, 1),
                "step_over_floor": round(res["step_ms"] / res["step_floor_ms"], 3),
                "synthetic_prefill": args.synthetic_prefill,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del engine
            free_memory()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = {
        "throughput": ["model", "kv_dtype", "num_requests", "output_tok_s", "total_tok_s", "max_total_num_tokens",
                       "preemptions", "seconds"],
        "long": ["kv_dtype", "mode", "running_requests", "decode_tok_s", "steady_tok_s",
                 "max_total_num_tokens", "step_ms",
                 "step_floor_ms", "step_over_floor", "first_step_ms", "max_step_ms"],
    }  # fmt: skip
    for bench, names in cols.items():
        part = [r for r in rows if r["bench"] == bench]
        if not part:
            continue
        widths = [max(len(n), *(len(str(r[n])) for r in part)) for n in names]
        print("\n" + "  ".join(n.ljust(w) for n, w in zip(names, widths)))
        for r in part:
            print("  ".join(str(r[n]).ljust(w) for n, w in zip(names, widths)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: use --smoke for the CPU check", file=sys.stderr)
        return 2
    rows: list[dict[str, Any]] = []
    if args.part in ("throughput", "all"):
        for model in args.throughput_models:
            rows += bench_throughput(args, model)
    if args.part in ("long", "all"):
        rows += bench_long(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("bench_engine_smoke.json" if args.smoke else "bench_engine.json")
    device = "cpu" if args.smoke else torch.cuda.get_device_name()
    data = {
        "device": device, "commit": os.environ.get("COMMIT", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "args": vars(args) | {"out": str(args.out)}, "rows": rows,
    }  # fmt: skip
    path.write_text(json.dumps(data, indent=1))
    print_table(rows)
    from plot_engine import plot

    plot(data, path.with_suffix(".png"))
    print(f"\nwrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
