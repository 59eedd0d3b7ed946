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
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import torch

from nibblekv.config import QUANTIZATIONS, EngineConfig
from nibblekv.engine.engine import Engine
from nibblekv.engine.setup import resident_capacity
from nibblekv.engine.gc_heap import frozen_heap
from nibblekv.engine.request import Request, RequestStatus
from nibblekv.engine.sampling_params import SamplingParams
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


def rotating_last(kv_dtypes: list[str]) -> list[str]:
    """``kv_dtypes`` with nvfp4 (whose engines fold the Hadamard rotation into the shared model's o_proj)
    last. NOTE: a bf16/fp8 engine built on a folded model pays one extra matmul per layer to rotate its
    output into the folded basis; timing it after nvfp4 would bias the comparison against it."""
    return sorted(kv_dtypes, key=lambda kv: kv == "nvfp4")


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


def load(args: argparse.Namespace, name: str) -> tuple[Any, Any]:
    """A dummy (random-weight) model; with --smoke the tiny config whatever ``name`` says."""
    if args.smoke:
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(json.dumps(TINY))
        name = str(path)
    device = "cpu" if args.smoke else "cuda"
    overrides = base_config(args, name).model_overrides()
    quant = QuantMethod(args.quantization) if args.quantization else None
    return load_model(
        name, load_format="dummy", device=device, seed=args.seed, overrides=overrides, quantization=quant
    )


def free_memory() -> None:
    """Give a dropped engine's pool and graphs back (call after ``del engine``)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, min(vocab, 32000)) for _ in range(n)]


# ---- throughput -----------------------------------------------------------------------------------
def bench_throughput(args: argparse.Namespace, model_name: str) -> list[dict[str, Any]]:
    loaded = load(args, model_name)
    vocab = loaded[0].config.vocab_size
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
        engine = Engine(cfg, loaded=loaded)
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
def read_bandwidth(device: torch.device, gib: float) -> float:
    """Best of a full read (``x.sum()``) and a copy (read + write bytes), bytes/s."""
    n = int(gib * (1 << 30)) // 2
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    best = 0.0
    for fn, nbytes in ((lambda: x.sum(), 2 * n), (lambda: y.copy_(x), 4 * n)):
        fn()
        times = []
        for _ in range(10):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        best = max(best, nbytes / statistics.median(times))
    # NOTE: hand the probe's 8 GiB back to the driver: engines size their pool from the free memory,
    # and the first one read ~4% low while the allocator still cached these buffers.
    del x, y
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return best


def kv_bytes_read(engine: Engine) -> int:
    """K/V bytes a decode step over the running requests reads (main + tail, all layers)."""
    spec = engine.pool.spec
    main_bpt, tail_bpt = spec.layout.bytes_per_token(), spec.tail_layout.bytes_per_token()
    total = 0
    for r in engine.scheduler.running:
        main = min(r.pages.num_main, r.num_tokens)
        total += main * main_bpt + (r.num_tokens - main) * tail_bpt
    return total * spec.num_layers


def capacity_requests(cfg: EngineConfig, loaded: tuple[Any, Any], per_request: int) -> int:
    """The most requests of ``per_request`` tokens the pool holds at once (the engine's own sizing)."""
    model = loaded[0]
    n = resident_capacity(cfg, model, per_request, cfg.context_length or model.config.max_position_embeddings)
    if n == 0:
        raise ValueError(f"the KV pool cannot hold one request of {per_request} tokens")
    return n


def admit_with_prefix(engine: Engine, req: Request, cached: int) -> None:
    """Admit ``req`` running, its first ``cached`` tokens' pages allocated but not computed: the scheduler
    prefills the rest (in chunks, the extend path over that prefix) as if a prefix cache had held them."""
    sched = engine.scheduler
    engine.enqueue(req)
    sched.waiting.remove(req)
    if cached:
        sched.cache.finish_growth(sched.cache.grow(req.pages, cached))
    if sched.states is not None:  # a hybrid model's linear-attention state (left zero: timing only)
        req.state_slot = sched.states.alloc()
    req.status = RequestStatus.RUNNING
    sched.running.append(req)


def synthetic_prefill(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> None:
    """Admit every request with its prompt's pages allocated but not computed, plus one sampled token."""
    for p in prompts:
        req = engine.make_request(p, params)
        admit_with_prefix(engine, req, req.num_tokens)
        req.token_ids.append(p[-1])


@contextlib.contextmanager
def kernel_profile() -> Iterator[list[dict[str, Any]]]:
    """Profile the block (GPU kernels on CUDA, else CPU ops); on exit the yielded list holds every kernel
    that took time: ``{"kernel", "us" (total), "calls"}``, most time first."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    rows: list[dict[str, Any]] = []
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        yield rows
        sync()
    for ev in prof.key_averages():
        us = ev.device_time_total if gpu else ev.self_cpu_time_total
        if us > 0:
            rows.append({"kernel": ev.key[:90], "us": us, "calls": ev.count})
    rows.sort(key=lambda r: -r["us"])


def profiled(engine: Engine, n: int, top: int = 12) -> dict[str, Any]:
    """Run ``n`` engine steps under the torch profiler: per step, the wall time, the summed time of all
    GPU kernels (busy), the kernel count, and the ``top`` kernels with the most total time. Wall minus busy is
    the time the GPU waited for the host (or for launches)."""
    sync()
    t0 = time.perf_counter()
    with kernel_profile() as rows:
        for _ in range(n):
            engine.step()
    wall = time.perf_counter() - t0
    top = [
        {"kernel": r["kernel"], "ms_per_step": round(r["us"] / 1e3 / n, 3), "calls_per_step": r["calls"] / n}
        for r in rows[:top]
    ]
    return {
        "top_kernels": top,
        "profiled_step_ms": round(1e3 * wall / n, 3),  # includes the profiler's own overhead
        "gpu_busy_ms_per_step": round(sum(r["us"] for r in rows) / 1e3 / n, 3),
        "kernels_per_step": sum(r["calls"] for r in rows) / n,
    }


def decode_run(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, synthetic: bool, bandwidth: float,
    profile_steps: int = 0, profile_top: int = 12,
) -> dict[str, Any]:  # fmt: skip
    """Run to completion; time the decode steps that run the full batch."""
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    if synthetic:
        synthetic_prefill(engine, prompts, params)
    else:
        for p in prompts:
            engine.add_request(p, params)
    steps: list[tuple[int, float, float]] = []  # (batch size, seconds, floor seconds)
    prof: dict[str, Any] = {}
    # NOTE: with the overlap schedule a step launches the next batch before it returns; a sync around
    # each step would leave the GPU idle while the host schedules. There, a step's time is the host interval
    # between steps, which the GPU paces.
    barrier = (lambda: None) if engine.overlap_schedule else sync
    while engine.has_unfinished():
        floor = (weights + kv_bytes_read(engine)) / bandwidth
        # once, after the first steps' compiles and graph captures
        profile = profile_steps > 0 and len(steps) == 3 and not prof
        barrier()
        t0 = time.perf_counter()
        if profile:
            prof = profiled(engine, profile_steps, profile_top)
        else:
            engine.step()
        barrier()
        batch = engine.last_batch
        if batch is not None and batch.is_decode and not profile:
            steps.append((len(batch.reqs), time.perf_counter() - t0, floor))
    full = max(bs for bs, _, _ in steps)
    at_full = [(bs, t, f) for bs, t, f in steps if bs == full]
    # NOTE: the first full step pays one-time costs (Triton compiles, CUDA-graph capture): reported apart
    timed = at_full[1:] or at_full
    step = statistics.median(t for _, t, _ in at_full)
    return {
        "running_requests": full,
        "decode_tok_s": round(sum(bs for bs, _, _ in timed) / sum(t for _, t, _ in timed), 1),
        "first_step_ms": round(1e3 * at_full[0][1], 3),
        "max_step_ms": round(1e3 * max(t for _, t, _ in timed), 3),
        **({"top_kernels": []} | prof),
        "step_ms": round(1e3 * step, 3),
        # NOTE: the steady state, running requests over the median step: decode_tok_s also averages in the
        # second step (one-time costs, 41-88 ms at 26 x 32K on the H200), the short step after the profiled
        # ones and the last (26 requests' pages freed, 44-63 ms): FP8's unchanged path read 1397.8 and 1432.3
        # tok/s in two runs of one session, 17.84 and 17.92 ms median steps (engine-matched-s40*-h200/)
        "steady_tok_s": round(full / step, 1),
        "step_floor_ms": round(1e3 * statistics.median(f for _, _, f in at_full), 3),
        "decode_steps_at_full": len(at_full),
        # every timed decode step in order (batch size, ms): where a slow step falls says what it was
        "steps": [[bs, round(1e3 * t, 3)] for bs, t, _ in steps],
        "cuda_graph": engine.runner.last_used_graph,
        "overlap": engine.overlap_schedule,
    }


def bench_long(args: argparse.Namespace) -> list[dict[str, Any]]:
    loaded = load(args, args.long_model)
    dev = loaded[0].device
    bandwidth = read_bandwidth(dev, 0.0625 if args.smoke else 4.0)
    page = EngineConfig().page_size
    per_request = (-(-(args.long_input + args.long_output) // page) + 1) * page
    cfg = replace(
        base_config(args, args.long_model), context_length=args.long_input + args.long_output + page
    )
    rng = random.Random(args.seed)
    vocab = loaded[0].config.vocab_size
    params = SamplingParams(temperature=0, max_new_tokens=args.long_output, ignore_eos=True)
    if args.long_requests:  # fixed batch sizes, e.g. the small batches of a low-concurrency server
        runs = [(f"requests={n}", n) for n in args.long_requests]
    else:
        runs = [("matched", capacity_requests(replace(cfg, kv_cache_dtype="bf16"), loaded, per_request)),
                ("capacity", 0)]  # fmt: skip
    rows = []
    for kv in rotating_last(args.kv_dtypes):
        for mode, fixed in runs:
            kv_cfg = replace(cfg, kv_cache_dtype=kv)
            n = fixed or capacity_requests(kv_cfg, loaded, per_request)
            engine = Engine(replace(kv_cfg, max_running_requests=n), loaded=loaded)
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
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from plot_engine import plot

    plot(data, path.with_suffix(".png"))
    print(f"\nwrote {path} and {path.with_suffix('.png').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
