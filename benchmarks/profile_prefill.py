"""Where a prefill step over a cached prefix spends its time, per KV dtype (issue 6: in the agentic sweep
nvfp4's TTFT was 4-8% above fp8_e4m3's at 1-8 sessions, prefix-h200.json, which is where its ~1% of
throughput went).

Per dtype, one engine over a shared dummy model: ``--batch`` requests A (``--prefix`` tokens each) run, so
their pages sit in the radix cache; then ``--repeats`` times, requests B = each A's prompt + ``--new`` fresh
tokens (one output token) run their prefill together in one step: the extend path over A's cached pages, as
agentic turns do. Reports the median step time (no profiler; overlap schedule off so a step is the prefill
itself) and one profiled step's top GPU kernels.

    PYTHONPATH=. python benchmarks/profile_prefill.py --out DIR          # GPU, dummy Llama-3.1-8B
    PYTHONPATH=. python benchmarks/profile_prefill.py --smoke            # tiny CPU run of the same code
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import (  # noqa: E402
    base_config, free_memory, load, profiled, random_prompt, rotating_last, sync,
)

from nibblekv.engine.engine import Engine  # noqa: E402
from nibblekv.engine.sampling_params import SamplingParams  # noqa: E402


def enqueue(engine: Engine, prompts: list[list[int]]) -> None:
    """``prompts`` as requests of one greedy output token each."""
    for p in prompts:
        engine.add_request(p, SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True))


def prefill_step(engine: Engine, prompts: list[list[int]]) -> float:
    """Seconds of the one step that prefills ``prompts`` together (and samples their only tokens)."""
    enqueue(engine, prompts)
    sync()
    t0 = time.perf_counter()
    engine.step()
    sync()
    secs = time.perf_counter() - t0
    if engine.has_unfinished():
        raise RuntimeError("the prefill did not finish in one step (raise --chunked-prefill-size)")
    return secs


def run_dtype(engine: Engine, args: argparse.Namespace, vocab: int, rng: random.Random) -> dict[str, Any]:
    prefixes = [random_prompt(rng, args.prefix, vocab) for _ in range(args.batch)]
    prefill_step(engine, prefixes)  # the A's: their pages stay in the radix cache

    def turn() -> list[list[int]]:
        return [p + random_prompt(rng, args.new, vocab) for p in prefixes]

    prefill_step(engine, turn())  # warm-up (compiles)
    hits0 = engine.cache_stats().get("cached_tokens_total", 0)
    times = [prefill_step(engine, turn()) for _ in range(args.repeats)]
    cached = (engine.cache_stats().get("cached_tokens_total", 0) - hits0) / args.repeats
    enqueue(engine, turn())
    prof = profiled(engine, 1, args.top)
    runs = [round(1e3 * t, 3) for t in times]
    step = round(1e3 * statistics.median(times), 3)
    return {"step_ms": step, "step_ms_runs": runs, "cached_tokens": cached, **prof}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--kv-dtypes", nargs="+", default=["fp8_e4m3", "nvfp4", "bf16"])
    ap.add_argument("--prefix", type=int, default=1312, help="cached tokens (the agentic sweep's mean)")
    ap.add_argument("--new", type=int, default=1400, help="fresh tokens per turn (its mean: ~1.4K)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1, help="requests prefilled together in each step")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--kv-recent-window", type=int, default=64)
    ap.add_argument("--mem-fraction-static", type=float, default=0.88)
    args = ap.parse_args()
    if args.smoke:
        args.prefix, args.new, args.repeats = 40, 24, 2
    args.seed, args.disable_cuda_graph = 0, False
    args.chunked_prefill_size = max(8192, args.batch * (args.new + 16))  # NOTE: one step per turn
    args.cuda_graph_max_bs, args.overlap = None, False
    loaded = load(args, args.model)
    vocab = loaded[0].config.vocab_size
    rows = []
    for kv in rotating_last(args.kv_dtypes):
        cfg = replace(base_config(args, args.model), kv_cache_dtype=kv)
        cfg = replace(cfg, max_running_requests=max(8, args.batch))
        if args.smoke:
            cfg = replace(cfg, kv_recent_window=16, mem_budget_gib=0.01)
        engine = Engine(cfg, loaded=loaded)
        res = run_dtype(engine, args, vocab, random.Random(0))
        assert not engine.has_unfinished()
        rows.append({"kv_dtype": kv, "batch": args.batch, "prefix": args.prefix, "new": args.new, **res})
        print(json.dumps(rows[-1]), flush=True)
        engine.shutdown()
        del engine
        free_memory()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": os.environ.get("COMMIT", "unknown"), "model": args.model, "smoke": args.smoke,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    (args.out / "profile-prefill.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    base = {r["kv_dtype"]: r for r in rows}.get("fp8_e4m3")
    for r in rows:
        rel = f" ({r['step_ms'] / base['step_ms']:.3f}x fp8)" if base else ""
        print(f"\n{r['kv_dtype']} x{r['batch']}: step {r['step_ms']} ms{rel}, "
              f"GPU busy {r['gpu_busy_ms_per_step']} ms, "
              f"cached {r['cached_tokens']:.0f} tokens")  # fmt: skip
        for k in r["top_kernels"]:
            print(f"  {k['ms_per_step']:8.3f} ms  x{k['calls_per_step']:<5g} {k['kernel']}")


if __name__ == "__main__":
    main()
