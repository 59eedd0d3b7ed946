"""Does the pool's size or page placement move a decode row? (a device probe)

Stop 34: BF16 head_dim 64 8 x 32K read 147 us in two whole-benchmark runs (pool of 64 x 32K + 4096 tokens,
the row timed first after the pools were filled) against 132 us in probe_flush.py (pool of 64 x 8K + 4096,
the row timed after a write-flush timing of itself). This times that shape per dtype with the pool at both
sizes, pages at random places and in sequence, each twice in a row (a first-call effect shows as a gap
between the two), and writes ``$OUT/probe-pool.json``.

Usage: ``PYTHONPATH=. python benchmarks/probe_pool.py --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_kernels as bk  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--shape", default="8x32768")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--history", action="store_true",
                    help="first fill and free bench_kernels' head_dim-128 pools (~53 GB), as its run does")
    args = ap.parse_args()
    b, c = (int(x) for x in args.shape.split("x"))
    rows: list[dict[str, object]] = []
    if args.history:
        before = bk.Pools({dt: 64 * 32768 + 4096 for dt in bk.DTYPES}, 8, args.head_dim)
        us = bk.run_decode(before, bk.DTYPES[0], b, c, 32, False)[0]
        rows.append(dict(kv_dtype="bf16", history="fresh process", us=round(us, 2)))
        print(rows[-1], flush=True)
        del before
        bk._empty_cache()
        bf16, fp8, nvfp4 = bk.DTYPES
        big = {nvfp4: 128 * 131072 + 4096, fp8: 64 * 131072 + 4096, bf16: 32 * 131072 + 4096}
        pools = bk.Pools(big, 8, 128)
        bk.run_decode(pools, bk.DTYPES[0], 64, 32768, 32, False)
        del pools
        bk._empty_cache()
        print("filled and freed the head_dim-128 pools", flush=True)
    for pool_tokens in (64 * 32768 + 4096, 64 * 8192 + 4096, 64 * 32768 + 4096):
        pools = bk.Pools({dt: pool_tokens for dt in bk.DTYPES}, 8, args.head_dim)
        for order in ("random", "sequential"):
            bk.PAGE_ORDER = order
            for dt in bk.DTYPES:
                us = [round(bk.run_decode(pools, dt, b, c, 32, False)[0], 2) for _ in range(2)]
                row = dict(kv_dtype=bk.NAMES[dt], pool_tokens=pool_tokens, page_order=order, us=us)
                rows.append(row)
                print(row, flush=True)
        del pools
        bk._empty_cache()
    gpu = torch.cuda.get_device_name() if bk.DEV == "cuda" else "cpu"
    commit = os.environ.get("COMMIT", "unknown")
    doc = dict(shape=args.shape, head_dim=args.head_dim, flush=bk.FLUSH, commit=commit, gpu=gpu, rows=rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe-pool.json"), "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
