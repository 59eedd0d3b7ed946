"""What the L2 flush between timed calls costs the timed kernel (a device probe).

``bench_kernels.bench_graph`` empties L2 before every timed call. Until stop 33 it did so with
``zero_()`` on a 256 MB buffer, which leaves ~50 MB of *dirty* lines in L2: the timed kernel's first misses
must write them back to HBM, ~10 us of HBM time at 4.6 TB/s, charged to a kernel whose own call may be only
50-100 us (B x ctx = 256K shapes). Fits of time = fixed + bytes / rate put a 13-27 us "fixed cost" on every
dtype's 8K-32K rows (stop 28). This times the same decode calls with the flush as a write, as a read of the
same buffer (clean lines: the kernel's data is still not in L2, nothing to write back) and with no flush
(back to back), interleaved per shape, and writes ``$OUT/probe-flush.json``.

Usage: ``PYTHONPATH=. python benchmarks/probe_flush.py --out $OUT [--tiny]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import bench_kernels as bk  # noqa: E402
from nibblekv.formats.layout import KVDtype  # noqa: E402

# (q_heads, head_dim, batch, context, tail): the shapes that read under their targets at stop 33, a large one
# as a control (a ~1 ms call that a 10 us write-back cannot move much), and two that fit in L2 (1-9 MB: a
# flush that empties L2 makes them slower than back-to-back calls)
SHAPES = (
    (32, 128, 1, 1024, False), (32, 128, 8, 1024, False), (32, 128, 8, 32768, False),
    (32, 128, 32, 8192, False),
    (32, 128, 32, 8192, True), (32, 128, 64, 8192, False), (32, 128, 64, 32768, False),
    (32, 128, 1, 131072, False), (64, 128, 8, 32768, False), (64, 128, 32, 8192, False),
    (32, 64, 8, 32768, False), (32, 64, 64, 8192, False),
)  # fmt: skip
MODES = ("write", "read", "none", "write2")  # write2: the write flush again, the run-to-run spread


def probe(tiny: bool) -> list[dict[str, object]]:
    """One row per (shape, dtype): microseconds under each flush mode."""
    shapes = ((32, 128, 1, 80, False), (32, 64, 1, 96, False)) if tiny else SHAPES
    rows: list[dict[str, object]] = []
    for d in (128, 64):
        mine = [s for s in shapes if s[1] == d]
        most = max(b * c for _, _, b, c, _ in mine) + 4096
        pools = bk.Pools({dt: most for dt in bk.DTYPES}, 8, d)
        for hq, _, b, c, tail in mine:
            for dt in bk.DTYPES:
                row: dict[str, object] = dict(
                    kv_dtype=bk.NAMES[dt], q_heads=hq, head_dim=d, batch=b, context=c, tail=tail
                )
                for mode in MODES:
                    bk.set_flush(mode.rstrip("2"))
                    us, nbytes = bk.run_decode(pools, dt, b, c, hq, tail)
                    row[f"us_{mode}"], row["bytes"] = round(us, 2), nbytes
                rows.append(row)
                print(row, flush=True)
        del pools
        bk._empty_cache()
    bk.set_flush("read")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test (interpreter)")
    args = ap.parse_args()
    t0 = time.time()
    ceil = bk.read_ceiling(1 << 20 if args.tiny else 4 * bk.GiB)
    ceiling = max(ceil["torch_sum_tbps"], ceil["triton_stream_tbps"])
    rows = probe(args.tiny)
    for r in rows:
        for mode in MODES:
            tbps = float(r["bytes"]) / float(r[f"us_{mode}"]) / 1e6  # type: ignore[arg-type]
            r[f"frac_{mode}"] = round(tbps / ceiling, 4)
    gpu = torch.cuda.get_device_name() if bk.DEV == "cuda" else "cpu"
    commit = os.environ.get("COMMIT", "unknown")
    doc = dict(ceiling_tbps=round(ceiling, 4), ceiling_probes=ceil, commit=commit, gpu=gpu,
               torch=torch.__version__, rows=rows)  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe-flush.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{'shape':28s} " + " ".join(f"{m:>8s}" for m in MODES) + "   (fraction of the ceiling)")
    for r in rows:
        tail = " t" if r["tail"] else ""
        name = f"{r['kv_dtype']} {r['q_heads']}/{r['head_dim']} {r['batch']}x{r['context']}{tail}"
        print(f"{name:28s} " + " ".join(f"{r[f'frac_{m}']:8.3f}" for m in MODES))
    print(f"done {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
