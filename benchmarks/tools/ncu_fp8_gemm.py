"""Question: why do the FP8 GEMMs stream weights at ~2 TB/s at 1-256 tokens where bf16 ``torch.mm`` reaches
~2.5 (H100)? One call of each GEMM per row, for ncu: the grid GEMM with its default tile (``gemm_tile``), the
TMA GEMM with its default tile or one named, cuBLASLt's row-wise ``torch._scaled_mm`` and bf16 ``torch.mm``.

Usage on the device (only the calls between cudaProfilerStart/Stop are profiled; ncu empties the caches
before each kernel by default, as ``bench_graph`` does)::

    PYTHONPATH=. ncu --profile-from-start off --clock-control none --set full --import-source no \
        -o $OUT/fp8_gemm -f python3 benchmarks/tools/ncu_fp8_gemm.py --rows qkv:128 o:128 gate_up:1

then ``ncu -i REPORT --page details``, or a JSON of each kernel's time, DRAM bytes and rate, SM activity and
top warp stalls, labelled by the run's log (the ncu run's stdout)::

    ncu -i REPORT --page raw --csv > RAW.csv
    python3 benchmarks/tools/ncu_fp8_gemm.py --summarize RAW.csv LOG --gpu NAME --out FILE.json  # env COMMIT

A row is ``proj:m[:format]`` (an 8B projection of ``bench_fp8.SHAPES_8B``, format ``channel`` by default or
``block``); ``--kernels`` picks among ``grid tma cublaslt bf16``; ``--grid-tile
BMxBN:warps:stages:split[:x]`` sets the grid GEMM's launch (default: ``gemm_tile``'s), ``--tma-tile
BMxBN:split:warps:stages:programs_per_sm`` the TMA GEMM's (default: ``tma_tile``'s, or for more tokens than
it serves 64x128, 1 split, 4 warps, 6 stages, 1 program an SM -- the best TMA tile at 128 tokens in
``fp8-tma-h100.json``). Two warm-up calls compile and settle; the profiled call is the third. Each call is
checked against the twin first.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `benchmarks.*`
from benchmarks.bench_fp8 import SHAPES_8B  # noqa: E402
from benchmarks.fp8_tma import BLOCK, Fp8Operands  # noqa: E402
from benchmarks.timing import profile_once  # noqa: E402
from benchmarks.tools.ncu_summary import kernel_rows, write_summary  # noqa: E402
from nibblekv.kernels.fp8.tiles import GemmTile, TmaTile, tma_tile  # noqa: E402

KERNELS = ("grid", "tma", "cublaslt", "bf16")


def parse_tma(spec: str) -> TmaTile:
    """``BMxBN:split:warps:stages:programs_per_sm`` (a trailing ``:x`` swaps) -> :class:`TmaTile`."""
    parts = spec.split(":")
    bm, bn = (int(v) for v in parts[0].split("x"))
    split, warps, stages, pps = (int(v) for v in parts[1:5])
    return TmaTile(bm, bn, split, warps, stages, pps, swap_ab=parts[5:6] == ["x"])


def parse_grid(spec: str) -> GemmTile:
    """``BMxBN:warps:stages:split[:x]`` (``x``: swapped) -> :class:`GemmTile`."""
    parts = spec.split(":")
    bm, bn = (int(v) for v in parts[0].split("x"))
    warps, stages, split = (int(v) for v in parts[1:4])
    return GemmTile(bm, bn, warps, stages, split, swap_ab=parts[4:5] == ["x"])


def calls(
    proj: str, m: int, fmt: str, kernels: list[str], tma: TmaTile | None, grid: GemmTile | None = None
) -> dict[str, Callable]:
    """The named GEMM calls at one projection and token count, each checked against the twin."""
    n, k = {name: (n, k) for name, n, k in SHAPES_8B}[proj]
    ops = Fp8Operands.make(torch.randn(n, k, device="cuda") / k**0.5, m, fmt)
    grid = grid or ops.grid_tile()
    tile = tma or tma_tile(m, n, triton.cdiv(k, BLOCK), ops.block is not None) or TmaTile(64, 128, 1, 4, 6, 1)
    out: dict[str, Callable] = {}
    if "grid" in kernels:
        out[f"grid {grid}"] = ops.grid(grid)
    if "tma" in kernels:
        out[f"tma {tile}"] = ops.tma(tile)
    if "cublaslt" in kernels and ops.block is None:
        out["cublaslt"] = ops.cublaslt()
    want = ops.twin()
    for name, fn in out.items():
        ops.check(fn(), want, f"{proj} m={m} {fmt} {name}")
    if "bf16" in kernels:
        out["bf16 mm"] = ops.bf16()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", help="proj:m[:format], e.g. qkv:128 o:64:block")
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    ap.add_argument("--tma-tile", default=None, help="BMxBN:split:warps:stages:programs_per_sm[:x]")
    ap.add_argument("--grid-tile", default=None, help="BMxBN:warps:stages:split[:x] (default gemm_tile's)")
    ap.add_argument("--summarize", nargs=2, metavar=("RAW_CSV", "LOG"), help="JSON of an ncu report instead")
    ap.add_argument("--out", default=None, help="--summarize: the JSON file (default: stdout)")
    ap.add_argument("--gpu", default="unknown", help="--summarize: the GPU the report was taken on")
    args = ap.parse_args()
    if args.summarize:
        write_summary(args.out, args.gpu, kernels=kernel_rows(*args.summarize))
        return
    if not args.rows:
        ap.error("--rows is required unless --summarize")
    tma = parse_tma(args.tma_tile) if args.tma_tile else None
    grid = parse_grid(args.grid_tile) if args.grid_tile else None
    for spec in args.rows:
        proj, m, *rest = spec.split(":")
        fmt = rest[0] if rest else "channel"
        for name, fn in calls(proj, int(m), fmt, args.kernels, tma, grid).items():
            profile_once(fn, f"{proj} m={m} {fmt}: {name}")


if __name__ == "__main__":
    main()
