"""Question: for per-token FP8 activation scales of a long row (K > ``ROW_TILE_MAX``), which route of
``quant_fp8_groups`` is faster at each token count: the row as one tile read once, or the two-pass loop?

Usage on the device::

    PYTHONPATH=. python benchmarks/tools/fp8_quant_rows.py [--ks 14336 28672] [--ms 1 16 ... 8192] --out DIR

Each (K, M) is timed both ways (CUDA-graph replay, L2 emptied per call, ``timing.bench_graph``) by setting
``quant.LONG_ROW_TILE_MAX_M`` to M (tile) or 0 (loop), after checking both give the reference's bytes.
Writes ``DIR/fp8-quant-rows.json`` (rows: k, m, tile_us, loop_us; top level gpu, date, commit) and prints a
table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for timing
import timing  # noqa: E402

from nibblekv.formats.fp8_weights import quantize_act_groups  # noqa: E402
from nibblekv.kernels.fp8 import quant  # noqa: E402


def time_route(x: torch.Tensor, ref: tuple[torch.Tensor, torch.Tensor], tile: bool) -> float:
    """Median us of ``quant_fp8_groups(x, None)`` by one route (checked bit for bit against ``ref``, the
    reference's codes and scales)."""
    quant.LONG_ROW_TILE_MAX_M = x.shape[0] if tile else 0
    q, s = quant.quant_fp8_groups(x, None)
    qr, sr = ref
    if not (torch.equal(q.view(torch.uint8), qr.view(torch.uint8)) and torch.equal(s, sr)):
        raise SystemExit(f"{'tile' if tile else 'loop'} route differs from the reference at {tuple(x.shape)}")
    return timing.bench_graph(lambda: quant.quant_fp8_groups(x, None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[14336, 28672], help="row lengths (8B / 70B down)")
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 64, 256, 1024, 2048, 8192])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args()
    rows = []
    for k in args.ks:
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            ref = quantize_act_groups(x, k)
            tile_us, loop_us = time_route(x, ref, True), time_route(x, ref, False)
            rows.append({"k": k, "m": m, "tile_us": round(tile_us, 2), "loop_us": round(loop_us, 2)})
            print(f"K {k:6d} M {m:5d}: tile {tile_us:8.2f} us  loop {loop_us:8.2f} us", flush=True)
    res = {
        "gpu": torch.cuda.get_device_name(), "commit": os.environ.get("COMMIT", "unknown"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "rows": rows,
    }  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8-quant-rows.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
