"""Small-batch decode A/B: which nvfp4 engine setting makes a 1-2 request step slower than fp8_e4m3's.

Why: at 1 / 2 requests x 3K tokens (dummy Llama-3.1-8B, CUDA graphs, overlap schedule) the nvfp4 step was
5.27 / 5.37 ms vs fp8's 4.93 / 5.15 while the profiled kernel sums differed by only 0.14 / 0.03 ms
(benchmarks/results/small-profile-h200.json): the agentic sweep's 2-session tie (issue 6). Each variant
switches one nvfp4 default off (Hadamard rotation, 4over6 scales, sink page, bf16 tail, decode_mma) in
its own engine over one shared model, and reports the median step and the time the host spent waiting
for the GPU's tokens (overlap schedule): wait ~0 means the host, not the GPU, paces the step.

    PYTHONPATH=. python benchmarks/bench_small_ab.py --out DIR          # GPU
    PYTHONPATH=. python benchmarks/bench_small_ab.py --smoke            # tiny CPU run of the same code
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

from bench_engine import free_memory, load, synthetic_prefill, sync  # noqa: E402

from nibblekv.config import EngineConfig  # noqa: E402
from nibblekv.engine import overlap  # noqa: E402
from nibblekv.engine.engine import Engine  # noqa: E402
from nibblekv.engine.sampling_params import SamplingParams  # noqa: E402

# (name, kv dtype, EngineConfig overrides, decode variant env). NOTE: the non-rotating variants run before
# any rotating nvfp4 engine: the first such engine folds the Hadamard rotation into the shared o_proj, and
# a later engine without it would pay one extra matmul per layer (bench_engine.rotating_last).
VARIANTS: list[tuple[str, str, dict[str, Any], str]] = [
    ("fp8", "fp8_e4m3", {}, ""),
    ("fp8 window0", "fp8_e4m3", {"kv_recent_window": 0}, ""),
    ("nvfp4 nohad", "nvfp4", {"kv_hadamard": False}, ""),
    ("nvfp4 nohad no4o6 nosink", "nvfp4", {"kv_hadamard": False, "kv_quant_4over6": False, "kv_sink_pages": 0}, ""),
    ("nvfp4 nohad window0", "nvfp4", {"kv_hadamard": False, "kv_recent_window": 0}, ""),
    ("nvfp4", "nvfp4", {}, ""),
    ("nvfp4 no4o6", "nvfp4", {"kv_quant_4over6": False}, ""),
    ("nvfp4 nosink", "nvfp4", {"kv_sink_pages": 0}, ""),
    ("nvfp4 window0", "nvfp4", {"kv_recent_window": 0}, ""),
    ("nvfp4 tok", "nvfp4", {}, "tok"),
    ("nvfp4 minc32", "nvfp4", {}, "mma:minc=32"),
    ("nvfp4 minc128", "nvfp4", {}, "mma:minc=128"),
    ("nvfp4 minc256", "nvfp4", {}, "mma:minc=256"),
    ("nvfp4 again", "nvfp4", {}, ""),
]


class WaitClock:
    """Sums the time ``overlap.Pending.wait`` blocks (the host waiting for the GPU's tokens)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._orig = overlap.Pending.wait

    def __enter__(self) -> WaitClock:
        clock, orig = self, self._orig

        def wait(p: overlap.Pending) -> list[int]:
            t0 = time.perf_counter()
            try:
                return orig(p)
            finally:
                clock.total += time.perf_counter() - t0

        overlap.Pending.wait = wait  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        overlap.Pending.wait = self._orig  # type: ignore[method-assign]


def run_variant(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> dict[str, Any]:
    """Decode to completion; median step and median wait over the steps after the first three."""
    synthetic_prefill(engine, prompts, params)
    steps, waits = [], []
    with WaitClock() as clock:
        while engine.has_unfinished():
            w0 = clock.total
            t0 = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - t0)
            waits.append(clock.total - w0)
    sync()
    timed = slice(3, -2) if len(steps) > 8 else slice(None)
    return {
        "step_ms": round(1e3 * statistics.median(steps[timed]), 3),
        "wait_ms": round(1e3 * statistics.median(waits[timed]), 3),
        "host_ms": round(1e3 * statistics.median(s - w for s, w in zip(steps[timed], waits[timed])), 3),
        "steps": len(steps),
        "cuda_graph": engine.runner.last_used_graph,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--input", type=int, default=3072)
    ap.add_argument("--output", type=int, default=48)
    ap.add_argument("--only", nargs="*", default=None, help="variant names to run")
    args = ap.parse_args()
    args.seed, model = 0, "llama-3.1-8b"
    if args.smoke:
        args.input, args.output, args.requests = 40, 12, [1, 2]
    loaded = load(args, model)
    page = EngineConfig().page_size
    common: dict[str, Any] = {"load_format": "dummy", "seed": 0, "decode_log_interval": 0,
                              "context_length": args.input + args.output + 2 * page}  # fmt: skip
    if args.smoke:
        base = EngineConfig(model=model, device="cpu", mem_budget_gib=0.02, **common)
    else:
        base = EngineConfig(model=model, device="cuda", mem_fraction_static=0.88, **common)
    if args.smoke:
        base = replace(base, kv_recent_window=16)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_new_tokens=args.output, ignore_eos=True)
    rows = []
    for name, kv, over, variant in VARIANTS:
        if args.only and name not in args.only:
            continue
        os.environ.pop("NIBBLEKV_DECODE_VARIANT", None)
        if variant:
            os.environ["NIBBLEKV_DECODE_VARIANT"] = variant
        for n in args.requests:
            cfg = replace(base, kv_cache_dtype=kv, max_running_requests=n, **over)
            engine = Engine(cfg, loaded=loaded)
            prompts = [[rng.randrange(loaded[0].config.vocab_size) for _ in range(args.input)] for _ in range(n)]
            res = run_variant(engine, prompts, params)
            assert engine.pool.all_free()
            rows.append({"variant": name, "kv_dtype": kv, "requests": n, **over, **res,
                         "overlap": engine.overlap_schedule})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del engine
            free_memory()
    os.environ.pop("NIBBLEKV_DECODE_VARIANT", None)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": os.environ.get("COMMIT", "unknown"), "model": model, "input": args.input,
            "output": args.output, "smoke": args.smoke}  # fmt: skip
    (args.out / "small-ab.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(f"\n{'variant':28} req  step_ms  wait_ms  host_ms")
    for r in rows:
        print(f"{r['variant']:28} {r['requests']:3}  {r['step_ms']:7.3f}  {r['wait_ms']:7.3f}  {r['host_ms']:7.3f}")


if __name__ == "__main__":
    main()
