"""Does bench_graph's untimed warm-up (``SETTLE_S``) move long decode rows? (a device probe)

Stop 34's full run with the 0.1 s warm-up read several 1-6 ms rows 1-7% lower than the two runs without it
(e.g. FP8 64 x 128K 0.943 -> 0.890) on another machine. This times such rows with and without it, interleaved
on one machine, and writes ``$OUT/probe-settle.json``.

Usage: ``PYTHONPATH=. python benchmarks/probe_settle.py --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_kernels as bk  # noqa: E402

ROWS = ((bk.KVDtype.NVFP4, 64, 32768), (bk.KVDtype.FP8, 64, 131072), (bk.KVDtype.NVFP4, 32, 131072),
        (bk.KVDtype.FP8, 128, 8192), (bk.KVDtype.NVFP4, 8, 32768))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args()
    pools = bk.Pools({bk.KVDtype.NVFP4: 32 * 131072 + 4096, bk.KVDtype.FP8: 64 * 131072 + 4096}, 8, 128)
    rows = []
    for dt, b, c in ROWS:
        row: dict[str, object] = dict(kv_dtype=bk.NAMES[dt], batch=b, context=c)
        for settle in (0.0, 0.1, 0.0, 0.1):
            bk.SETTLE_S = settle
            us = bk.run_decode(pools, dt, b, c, 32, False)[0]
            row.setdefault(f"us_settle_{settle}", []).append(round(us, 2))  # type: ignore[union-attr]
        rows.append(row)
        print(row, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe-settle.json"), "w") as f:
        json.dump(dict(commit=os.environ.get("COMMIT", "unknown"), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
