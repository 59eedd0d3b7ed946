"""Question: where does a decode step's host time go? cProfile over engine steps at a large running batch.

Why: at 256 running SmolLM2 requests the GPU finishes a decode step in ~2 ms while the step took 5.6-7.4 ms
on an H200: the host (scheduling, page growth, metadata, graph inputs, token bookkeeping) set the pace.
This prints the functions with the most own time per step, so the next cut goes where the time is.

Requests are admitted with their prompt pages allocated but not computed (``engine_timing.synthetic_prefill``),
then ``--warm`` steps run untimed and ``--steps`` under cProfile. On CPU use a tiny model
(``--json-model-override-args``): the reference attention there is not host work on a GPU.

Usage: ``PYTHONPATH=. python benchmarks/tools/profile_host.py --kv-dtype nvfp4 --requests 256 --out DIR``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for engine_timing
from engine_timing import synthetic_prefill  # noqa: E402

from nibblekv import Engine  # noqa: E402
from nibblekv.engine.gc_heap import frozen_heap  # noqa: E402
from nibblekv.engine.sampling_params import SamplingParams  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--kv-dtype", default="nvfp4")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--input", type=int, default=600, help="prompt tokens per request")
    p.add_argument("--warm", type=int, default=8, help="untimed decode steps first")
    p.add_argument("--steps", type=int, default=24, help="decode steps under cProfile")
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--json-model-override-args", default=None)
    p.add_argument("--max-total-tokens", type=int, default=None, help="CPU: the pool's size")
    p.add_argument("--out", default=None, help="directory for profile_host.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    need = args.requests * (args.input + args.warm + args.steps + 64)
    eng = Engine(
        model=args.model, load_format="dummy", kv_cache_dtype=args.kv_dtype,
        max_running_requests=args.requests,
        decode_log_interval=0, json_model_override_args=args.json_model_override_args,
        max_total_tokens=args.max_total_tokens or (None if torch.cuda.is_available() else need),
    )  # fmt: skip
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 500) for _ in range(args.input)] for _ in range(args.requests)]
    params = SamplingParams(max_new_tokens=args.warm + args.steps + 8, ignore_eos=True, temperature=0.0)
    synthetic_prefill(eng, prompts, params)
    with frozen_heap():
        for _ in range(args.warm):
            eng.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(args.steps):
            eng.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof.disable()
        wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_, ncalls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls_per_step": ncalls / args.steps,
                     "own_us_per_step": 1e6 * own / args.steps, "cum_us_per_step": 1e6 * cum / args.steps})
    rows.sort(key=lambda r: -r["own_us_per_step"])
    doc = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "model": args.model, "kv_dtype": args.kv_dtype, "requests": args.requests, "input": args.input,
        "steps": args.steps, "profiled_step_ms": round(1e3 * wall / args.steps, 3), "top": rows[: args.top],
    }  # fmt: skip
    print(f"{args.kv_dtype} x {args.requests} requests: {doc['profiled_step_ms']} ms a step under cProfile")
    for r in rows[: args.top]:
        own, cum, calls = r["own_us_per_step"], r["cum_us_per_step"], r["calls_per_step"]
        print(f"{own:9.1f} us own {cum:9.1f} cum {calls:7.1f} calls  {r['function']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "profile_host.json").write_text(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    main()
