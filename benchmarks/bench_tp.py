"""Tensor-parallel benchmark: a dummy Llama-3.1-70B-shaped model at ``--tp 2``, per KV dtype.

For bf16 / fp8_e4m3 / nvfp4 it reports each rank's KV pool (tokens, GiB; every rank holds half the
KV heads, so a token costs each GPU half its tp=1 bytes) and the decode throughput at 32K context:
``capacity`` runs as many 32K requests as the dtype's pool holds, ``matched`` runs each earlier dtype's
capacity count (nvfp4 at bf16's and at fp8_e4m3's).
Prompts' KV pages are allocated without being computed by default (decode timing does not depend on
the cached values; ``--real-prefill`` computes them, which takes minutes per dtype at 70B).

    PYTHONPATH=. python benchmarks/bench_tp.py                  # 2 GPUs (nvidia-h200-x2)
    PYTHONPATH=. python benchmarks/bench_tp.py --smoke          # tiny model, 2 gloo ranks on CPU

JSON goes to ``$OUT/bench_tp.json`` (or ``--out``), meant to be committed under
``benchmarks/results/``; a table is printed. At the 70B shape one dtype's engine start and runs take
~40-60 s on an H200 x2 (``tp-h200x2-*.log``); ``benchmarks/device/tp.sh`` logs each step to a file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import TINY
from engine_timing import decode_run, free_memory, read_bandwidth

from nibblekv.config import EngineConfig
from nibblekv.engine.engine import Engine
from nibblekv.engine.gc_heap import frozen_heap
from nibblekv.engine.sampling_params import SamplingParams

KV_DTYPES = ("bf16", "fp8_e4m3", "nvfp4")
GIB = float(1 << 30)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.1-70b", help="preset (dummy weights)")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--kv-dtypes", nargs="+", default=list(KV_DTYPES))
    p.add_argument("--context", type=int, default=32768, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-running-requests", type=int, default=128)
    p.add_argument("--mem-fraction-static", type=float, default=0.88)
    p.add_argument("--kv-recent-window", type=int, default=64)
    p.add_argument("--real-prefill", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny model, 2 gloo ranks on CPU (checks the code)")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    p.add_argument("--matched-requests", type=int, nargs="*", default=[],
                   help="also run each dtype at these counts (e.g. fp8_e4m3's capacity from an earlier call)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-steps", type=int, default=0, help="per-kernel profile of this many decode steps "
                   "(rank 0's GPU) in every run")
    p.add_argument("--profile-top", type=int, default=25)
    return p.parse_args(argv)


def engine_config(args: argparse.Namespace, kv: str, max_running: int) -> EngineConfig:
    common: dict[str, Any] = {
        "load_format": "dummy", "seed": args.seed, "tp_size": args.tp, "kv_cache_dtype": kv,
        "kv_recent_window": args.kv_recent_window, "disable_cuda_graph": args.disable_cuda_graph,
        "max_running_requests": max_running, "context_length": args.context + args.output_len + 16,
        "decode_log_interval": 0,
    }  # fmt: skip
    if args.smoke:
        path = Path(tempfile.mkdtemp()) / "config.json"
        path.write_text(json.dumps({**TINY, "max_position_embeddings": 1 << 16}))
        return EngineConfig(model=str(path), device="cpu", mem_budget_gib=2e-3, **common)
    return EngineConfig(
        model=args.model, device="cuda", mem_fraction_static=args.mem_fraction_static, **common
    )


def pool_row(engine: Engine) -> dict[str, Any]:
    spec = engine.pool.spec
    return {
        "kv_heads_per_rank": spec.num_kv_heads,
        "max_total_num_tokens": spec.max_total_num_tokens,
        "pool_gib_per_rank": round((spec.main_bytes() + spec.tail_bytes()) / GIB, 2),
        "weights_gib_per_rank": round(
            sum(p.numel() * p.element_size() for p in engine.model.parameters()) / GIB, 2
        ),
    }


def run_dtype(
    args: argparse.Namespace, kv: str, requests: list[int | None], bandwidth: float
) -> list[dict[str, Any]]:
    """One engine (all ranks) for ``kv``: its pool, then a decode run per entry of ``requests`` (None:
    as many as the pool holds). NOTE: one start-up per dtype -- a TP engine's start (worker processes,
    dummy weights, NCCL, CUDA-graph capture on every rank) is the slow part at 70B."""
    t0 = time.perf_counter()
    engine = Engine(engine_config(args, kv, args.max_running_requests))
    print(f"{kv}: engine up in {time.perf_counter() - t0:.0f} s", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        pool = pool_row(engine)
        per_request = args.context + args.output_len
        capacity = min(args.max_running_requests, engine.max_total_num_tokens // per_request)
        vocab = engine.model.config.vocab_size
        params = SamplingParams(max_new_tokens=args.output_len, ignore_eos=True)
        for want in requests:
            n = capacity if want is None else min(want, capacity)
            rng = random.Random(args.seed)
            prompts = [[rng.randrange(vocab) for _ in range(args.context)] for _ in range(n)]
            row: dict[str, Any] = {"kv_dtype": kv, "tp": args.tp, **pool, "capacity_requests": capacity}
            row["mode"] = "capacity" if want is None else "matched"
            with frozen_heap():  # as `nibblekv serve` runs (engine/gc_heap.py); the workers freeze theirs
                row.update(decode_run(engine, prompts, params, not args.real_prefill, bandwidth,
                                      args.profile_steps, args.profile_top))
            rows.append(row)
            print(json.dumps(row), flush=True)
            assert engine.pool.all_free(), "pages leaked between runs"
        return rows
    finally:
        engine.shutdown()
        del engine
        free_memory()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # NOTE: phase times in the log (weights, graph capture, each run): a 600 s device call once printed a
    # single row of three, with nothing saying where the time went
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.smoke:
        args.context, args.output_len, args.max_running_requests = 200, 8, 4
    bandwidth = read_bandwidth(torch.device("cuda"), 4.0) if torch.cuda.is_available() else 50e9
    rows: list[dict[str, Any]] = []
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / ("bench_tp_smoke.json" if args.smoke else "bench_tp.json")
    meta = {
        "model": "tiny" if args.smoke else args.model, "context": args.context, "output_len": args.output_len,
        "tp": args.tp, "commit": os.environ.get("COMMIT", "unknown"),  # NOTE: from the launching machine
        "gpu": f"{torch.cuda.device_count()}x {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
    }  # fmt: skip
    earlier: dict[str, int] = {}  # dtype -> requests its pool held
    for kv in args.kv_dtypes:
        # matched: each earlier (larger per-token) dtype's capacity count, e.g. nvfp4 at fp8_e4m3's
        matched = sorted(set(earlier.values()) | set(args.matched_requests))
        new_rows = run_dtype(args, kv, [None, *matched], bandwidth)
        for row in new_rows[1:]:
            row["matched_to"] = [k for k, v in earlier.items() if v == row["running_requests"]]
        rows.extend(new_rows)
        earlier[kv] = new_rows[0]["running_requests"]
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))  # after each dtype: a cut run keeps it
    cols = ["kv_dtype", "mode", "matched_to", "max_total_num_tokens", "pool_gib_per_rank", "capacity_requests",
            "running_requests", "decode_tok_s", "step_ms"]  # fmt: skip
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
