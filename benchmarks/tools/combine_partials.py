"""Question: how long does decode's split-K combine step take per partial dtype (fp32 / bf16), dims per program
and warps, at the shapes where it weighs most (head_dim 256, GQA 8: Qwen3-Next's 16 / 2 heads)?

Usage on the device::

    PYTHONPATH=. python benchmarks/tools/combine_partials.py [--shapes 64x8x256 8x66x256 1x512x256] --out DIR

A shape is ``BxSxD``: B requests of 16 query heads (2 KV heads), S written split slots a row, head_dim D -- the
slots ``decode_mma`` writes (``decode.launch``'s layout, no tail). Each (dtype, dims per program, warps) is
checked against a torch merge of the same partials, then timed (CUDA-graph replay, ``timing.bench_graph``) with
the partials warm in L2, as after the decode kernel that writes them: each call first rewrites them by a copy
whose time alone is subtracted. Writes ``DIR/combine-partials.json`` (rows: b, slots, d, dtype, db, warps, us)
and prints a table.
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

from nibblekv.kernels.decode.combine import _combine_kernel, combine_chunk  # noqa: E402

HQ = 16


def merge_ref(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``[B, H, S, D]`` partials with their log2-sum-exp2 ``[B, H, S]`` -> the merged ``[B, H, D]`` (fp32)."""
    w = torch.softmax(lse * 0.6931471805599453, dim=-1)
    return (o.float() * w[..., None]).sum(dim=2)


def launch(o: torch.Tensor, lse: torch.Tensor, lens: torch.Tensor, out: torch.Tensor, db: int, warps: int,
           splits: int) -> None:  # fmt: skip
    """The combine step as ``decode_triton`` launches it after ``decode_mma`` (a program per query head)."""
    b, hq, s, d = o.shape
    _combine_kernel[(b * hq, d // db)](
        o, lse, out, out.stride(0), out.stride(1), HQ=hq, S=s, D=d, DB=db, CH=combine_chunk(1, db, s),
        G=1, GP=1, lens_ptr=lens, MMA_SPLITS=splits, MMA_NW=1, MINC=16, HAS_TAIL=0, TAIL_SLOTS=1, PAIR=0,
        lse_out=None, WRITE_LSE=0, num_warps=warps,
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", default=["64x8x256", "8x66x256", "1x512x256"])
    ap.add_argument("--dbs", nargs="*", type=int, default=[16, 32, 64, 256])
    ap.add_argument("--warps", nargs="*", type=int, default=[4, 8])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for shape in args.shapes:
        b, s, d = (int(x) for x in shape.split("x"))
        # every split slot written: lens = s splits x 16 tokens (MINC 16)
        lens = torch.full((b,), s * 16, dtype=torch.int32, device=dev)
        lse = torch.randn(b, HQ, s, device=dev) * 4
        src32 = torch.randn(b, HQ, s, d, device=dev)
        for dtype in (torch.float32, torch.bfloat16):
            src = src32.to(dtype)
            o = src.clone()
            ref = merge_ref(src, lse)
            copy_us = timing.bench_graph(lambda: o.copy_(src))  # the rewrite alone, subtracted from each row
            for db in args.dbs:
                for warps in args.warps:
                    if d % db:
                        continue
                    out = torch.full((b, HQ, d), float("nan"), dtype=torch.bfloat16, device=dev)
                    launch(o, lse, lens, out, db, warps, s)
                    err = float((out.float() - ref).norm() / ref.norm())
                    if not err < 1e-2:
                        raise SystemExit(f"{shape} {dtype} db {db} warps {warps}: rel. error {err:.3g}")
                    both_us = timing.bench_graph(lambda: (o.copy_(src), launch(o, lse, lens, out, db, warps, s)))
                    row = dict(b=b, slots=s, d=d, dtype=str(dtype).removeprefix("torch."), db=db, warps=warps,
                               us=round(both_us - copy_us, 2), copy_us=round(copy_us, 2), rel_err=err)  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    doc = dict(
        gpu=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=os.environ.get("COMMIT", "unknown"), rows=rows,
    )  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "combine-partials.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'shape':>10} {'dtype':>9} {'db':>4} {'warps':>5} {'us':>7}")
    for r in rows:
        print(f"{r['b']}x{r['slots']}x{r['d']:>4} {r['dtype']:>9} {r['db']:>4} {r['warps']:>5} {r['us']:>7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
