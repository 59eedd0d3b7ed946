"""Why a small-batch decode kernel runs slower inside the engine than alone (a device probe).

In the engine (dummy Llama-3.1-8B, 1 request x 3K tokens, CUDA graphs, H200, 2026-11-30) ``decode_mma_kernel``
took 12 us a layer against 6.6 us alone in ``bench_decode_variants`` (same shape, same tail); FP8's
``decode_tok_kernel`` 8.2 vs 9.1. Between two decode launches the engine runs other kernels (GEMMs that
stream the weights through L2 and hold the SMs' instruction caches; norms, RoPE). This times each decode
variant's kernels (torch.profiler, eager) with a chosen kernel run before every call:

* ``flush``: zero a 256 MB buffer (what ``bench_kernels`` does: L2 cold, instruction caches kept);
* ``gemm``: ``x[1, 4096] @ W[4096, 14336]`` in bf16 (an 8B model's MLP: L2 and instruction caches cold,
  the GPU at GEMM power);
* ``other``: FP8's decode at the same shape (a different large kernel: instruction caches cold, L2 not).

Usage: ``PYTHONPATH=. python benchmarks/probe_small_decode.py --out $OUT [--shapes 1x3072 4x3072]``.

Answer (H200, 2026-11-30, ``benchmarks/results/probe-small-decode-h200.json``): none of the three slows
``decode_mma_kernel`` (5-6.7 us after each at 1 x 3K). The engine's slowdown came from the bf16 tail's own
launch running *beside* it (CUDA-graph branches; eager launches here never overlap): run in sequence
(``NIBBLEKV_SIDE_STREAM=0``) the kernel took 6.1 us, and with the tail inside its grid (``tin=1``) 7.6 us
with no tail launch (``small-batch-tail-h200.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_kernels import NAMES, PAGE, Pools, _flush_buffer
from nibblekv.formats.layout import KVDtype
from nibblekv.kernels.decode import decode_triton


def make_call(pools: Pools, dt: KVDtype, batch: int, ctx: int, spec: str):  # type: ignore[no-untyped-def]
    """A decode call (64-token bf16 tail, pages at random places) of variant ``spec``."""
    pool = pools.pools[dt]
    main = ctx - 64
    pages = triton.cdiv(main, PAGE)
    gen = torch.Generator().manual_seed(batch * 7919 + ctx)
    pt = torch.randperm(pool.num_pages, generator=gen)[: batch * pages].reshape(batch, pages).int().cuda()
    tpt = torch.randperm(pools.tail.num_pages, generator=gen)[: batch * 4].reshape(batch, 4).int().cuda()
    lens = torch.full((batch,), main, dtype=torch.int32, device="cuda")
    tl_ = torch.full((batch,), 64, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, 32, pools.head_dim, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    kw = dict(tail=pools.tail, tail_page_table=tpt, tail_lens=tl_, variant=spec, out=out)
    return lambda: decode_triton(q, pool, pt, lens, 1 / math.sqrt(pools.head_dim), **kw)


def _profile(calls, reps: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Total GPU us per kernel name of ``reps`` rounds of ``calls``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        for c in calls:
            c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for c in calls:
                c()
        torch.cuda.synchronize()
    return {e.key[:40]: float(getattr(e, "self_device_time_total", 0.0) or 0.0) for e in prof.key_averages()}


def per_kernel(fn, before, reps: int = 20) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Mean GPU us per call of each kernel ``fn`` launches, ``before()`` run ahead of every call (its own
    kernels subtracted by name: the evictor may share a kernel, e.g. the combine step)."""
    both, alone = _profile([before, fn], reps), _profile([before], reps)
    res = {k: round((t - alone.get(k, 0.0)) / reps, 2) for k, t in both.items()}
    return {k: v for k, v in res.items() if v > 0.05}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--shapes", nargs="*", default=["1x3072", "4x3072"])
    ap.add_argument("--variants", nargs="*", default=["fp8_e4m3=tok", "nvfp4=mma", "nvfp4=mma:tpi=1", "nvfp4=mma:ppsm=8"])
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    pools = Pools({dt: max(b * c for b, c in shapes) + 4096 for dt in NAMES}, 8, 128)
    by_name = {v: k for k, v in NAMES.items()}
    flush = _flush_buffer()
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16)
    rows = []
    for b, c in shapes:
        other = make_call(pools, KVDtype.FP8, b, c, "tok")
        modes = {"flush": lambda: flush.zero_(), "gemm": lambda: x @ w, "other": other}
        for item in args.variants:
            dt, spec = by_name[item.split("=", 1)[0]], item.split("=", 1)[1]
            fn = make_call(pools, dt, b, c, spec)
            for mode, before in modes.items():
                if mode == "other" and dt == KVDtype.FP8:
                    continue
                k = per_kernel(fn, before)
                rows.append(dict(batch=b, context=c, kv_dtype=NAMES[dt], variant=spec, before=mode, kernels_us=k))
                print(f"B{b}x{c} {NAMES[dt]:9s} {spec:18s} after {mode:5s}: {k}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe-small-decode.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
