"""bench_fp8 --tma: the persistent TMA GEMM (``kernels.fp8.gemm_tma``) beside the grid GEMM, cuBLASLt and bf16
mm, the GEMM alone at one projection and token count a row (``tma_row``), its launches from :func:`tma_tiles`.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from benchmarks.timing import DEV, bench_graph
from nibblekv.formats.fp8_weights import quantize_weight_block, quantize_weight_channel
from nibblekv.kernels.fp8.gemm import ROWWISE_K_STEP, fp8_block_gemm, fp8_rowwise_gemm
from nibblekv.kernels.fp8.gemm_tma import fp8_tma_gemm
from nibblekv.kernels.fp8.quant import quant_fp8_groups
from nibblekv.kernels.fp8.reference import fp8_gemm_ref
from nibblekv.kernels.fp8.tiles import TmaTile, gemm_tile

BLOCK = 128

# --tma: the persistent TMA GEMM (kernels.fp8.gemm_tma), (BLOCK_M, BLOCK_N, split-K, warps, stages, programs
# an SM, warp-specialized). 33-256 tokens: the batch in one or two M tiles, 64- and 128-wide weight tiles,
# k-splits that give every SM a unit, deeper pipelines, two programs an SM and a TMA producer warp
_TMA_TILES = (
    (64, 64, 1, 4, 4, 1, False), (64, 128, 1, 4, 4, 1, False), (128, 64, 1, 8, 4, 1, False),
    (128, 128, 1, 8, 4, 1, False), (128, 128, 2, 8, 4, 1, False), (128, 128, 3, 8, 4, 1, False),
    (64, 128, 2, 4, 4, 1, False), (128, 64, 2, 8, 4, 1, False), (64, 64, 2, 4, 6, 2, False),
    (64, 128, 1, 4, 6, 1, False), (128, 128, 2, 8, 4, 1, True), (64, 128, 2, 4, 4, 1, True),
)
# up to 32 tokens swapped (the weight tile is wgmma's M side), BLOCK_M the batch's 16 or 32: tma_tile's
# default (64-row weight tiles, 4 splits, 2 programs an SM) and its neighbours -- 128-row tiles, 2 / 8 splits,
# 3 programs an SM, deeper pipelines
_TMA_SWAP_TILES = (
    (64, 4, 4, 4, 2, False), (128, 2, 4, 6, 1, False), (64, 4, 4, 6, 1, False), (128, 4, 4, 4, 1, False),
    (64, 8, 4, 4, 2, False), (64, 4, 4, 4, 3, False), (64, 2, 4, 4, 2, False), (64, 4, 4, 6, 2, False),
)


def tma_tiles(m: int, block: int | None) -> dict[str, TmaTile]:
    """:data:`_TMA_TILES` for ``m`` tokens (BLOCK_M at most the batch rounded up to 64; block-scaled: weight
    tiles at most 128 wide), up to 32 tokens :data:`_TMA_SWAP_TILES`; named ``MxN kS wW sS pP`` (+ ``ws``
    warp-specialized, ``x`` swapped)."""
    out: dict[str, TmaTile] = {}
    if m <= 32:
        bm = 16 if m <= 16 else 32
        for bn, sp, w, st, pp, wsp in _TMA_SWAP_TILES:
            if not (block and bn > block):
                name = f"{bm}x{bn}k{sp}w{w}s{st}p{pp}" + ("ws" if wsp else "") + "x"
                out[name] = TmaTile(bm, bn, sp, w, st, pp, wsp, swap_ab=True)
        return out
    for bm, bn, sp, w, st, pp, wsp in _TMA_TILES:
        if bm > max(64, triton.next_power_of_2(m)) or (block and bn > block):
            continue
        name = f"{bm}x{bn}k{sp}w{w}s{st}p{pp}" + ("ws" if wsp else "")
        out[name] = TmaTile(bm, bn, sp, w, st, pp, wsp)
    return out


def tma_row(name: str, n: int, k: int, m: int, fmt: str, w: torch.Tensor) -> dict[str, Any]:
    """The GEMM alone at ``m`` tokens: the grid GEMM's tile for ``m`` (``gemm_tile``), cuBLASLt (per channel:
    row-wise ``torch._scaled_mm``), every :func:`tma_tiles` launch (each checked against the twin first) and
    bf16 mm."""
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    block = None if fmt == "channel" else BLOCK
    wq, ws = quantize_weight_channel(w) if block is None else quantize_weight_block(w, BLOCK)
    xq, xs = quant_fp8_groups(x, block)
    grid = gemm_tile(m, n, triton.cdiv(k, block or ROWWISE_K_STEP), block=block is not None)
    if block is None:
        default = lambda: fp8_rowwise_gemm(xq, xs, wq, ws, torch.bfloat16, tile=grid)  # noqa: E731
    else:
        default = lambda: fp8_block_gemm(xq, xs, wq, ws, BLOCK, torch.bfloat16, tile=grid)  # noqa: E731
    row: dict[str, Any] = dict(kind="tma", name=name, m=m, n=n, k=k, format=fmt)
    row["triton_us"] = round(bench_graph(default), 2)  # the grid GEMM (kernels.fp8.gemm), its tile for m
    if block is None and x.is_cuda:
        row["scaled_mm_us"] = round(bench_graph(
            lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16)
        ), 2)  # fmt: skip
    want = fp8_gemm_ref(xq, xs, wq, ws, block, torch.float32)
    times: dict[str, float] = {}
    for tname, tile in tma_tiles(m, block).items():
        fn = lambda t=tile: fp8_tma_gemm(xq, xs, wq, ws, block, torch.bfloat16, t)  # noqa: E731
        try:
            got = fn()
        except Exception as e:  # noqa: BLE001 - triton's OutOfResources and compile errors alike
            why = [line for line in str(e).splitlines() if line.strip()][-3:]
            print(f"tma tile {tname}: {type(e).__name__}: {' | '.join(why)[:400]}", flush=True)
            continue
        err = ((got.float() - want).norm() / want.norm()).item()
        if not err < 1e-2:
            raise AssertionError(f"{name} m={m} {fmt}: TMA tile {tname} is {err:.3g} (rel. L2) off the twin")
        times[tname] = round(bench_graph(fn), 2)
    row["tma_tiles_us"] = times
    wb = w.to(torch.bfloat16)
    row["bf16_us"] = round(bench_graph(lambda: torch.mm(x, wb.t())), 2)
    if times:
        best = min(times, key=times.get)
        row["tma_best"], row["tma_best_us"] = best, times[best]
        row["tma_speedup"] = round(row["bf16_us"] / times[best], 3)
    row["triton_speedup"] = round(row["bf16_us"] / row["triton_us"], 3)
    return row
