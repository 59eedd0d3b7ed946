"""bench_fp8 --tma: the persistent TMA GEMM (``kernels.fp8.gemm_tma``) beside the grid GEMM, cuBLASLt and bf16
mm, the GEMM alone at one projection and token count a row (``tma_row``), its launches from :func:`tma_tiles`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton

from benchmarks.timing import bench_graph
from nibblekv.formats.fp8_weights import quantize_weight_block, quantize_weight_channel
from nibblekv.kernels.fp8.gemm import ROWWISE_K_STEP, fp8_block_gemm, fp8_rowwise_gemm
from nibblekv.kernels.fp8.gemm_tma import fp8_tma_gemm
from nibblekv.kernels.fp8.quant import quant_fp8_groups
from nibblekv.kernels.fp8.reference import fp8_gemm_ref
from nibblekv.kernels.fp8.tiles import GemmTile, TmaTile, gemm_tile
from nibblekv.kernels.testing import rel_rms

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


@dataclass(frozen=True)
class Fp8Operands:
    """A projection's bf16 weight ``w [N, K]`` and ``m`` tokens ``x``, quantized for one format (``block``
    None: per channel / per token; 128: 128x128 weight blocks, 1x128 token groups), and the GEMM launches the
    benchmarks time on them (each a no-argument call, bf16 out)."""

    w: torch.Tensor
    x: torch.Tensor
    xq: torch.Tensor
    xs: torch.Tensor
    wq: torch.Tensor
    ws: torch.Tensor
    block: int | None

    @classmethod
    def make(cls, w: torch.Tensor, m: int, fmt: str) -> Fp8Operands:
        """``m`` random tokens for ``w``, both quantized as ``fmt`` (``channel`` / ``block``) asks."""
        x = torch.randn(m, w.shape[1], device=w.device).to(torch.bfloat16)
        block = None if fmt == "channel" else BLOCK
        wq, ws = quantize_weight_channel(w) if block is None else quantize_weight_block(w, BLOCK)
        xq, xs = quant_fp8_groups(x, block)
        return cls(w, x, xq, xs, wq, ws, block)

    def grid_tile(self) -> GemmTile:
        """``gemm_tile``'s launch for this batch and format."""
        (m, k), n = self.x.shape, self.w.shape[0]
        return gemm_tile(m, n, triton.cdiv(k, self.block or ROWWISE_K_STEP), block=self.block is not None)

    def grid(self, tile: GemmTile) -> Callable[[], torch.Tensor]:
        """The grid GEMM (``kernels.fp8.gemm``) of this format with ``tile``."""
        if self.block is None:
            return lambda: fp8_rowwise_gemm(self.xq, self.xs, self.wq, self.ws, torch.bfloat16, tile=tile)
        return lambda: fp8_block_gemm(self.xq, self.xs, self.wq, self.ws, BLOCK, torch.bfloat16, tile=tile)

    def tma(self, tile: TmaTile) -> Callable[[], torch.Tensor]:
        """The persistent TMA GEMM (``kernels.fp8.gemm_tma``) with ``tile``."""
        return lambda: fp8_tma_gemm(self.xq, self.xs, self.wq, self.ws, self.block, torch.bfloat16, tile)

    def cublaslt(self) -> Callable[[], torch.Tensor]:
        """cuBLASLt's row-wise scaled FP8 GEMM (``torch._scaled_mm``; per channel, CUDA only)."""
        scale_b = self.ws.view(1, -1)
        return lambda: torch._scaled_mm(
            self.xq, self.wq.t(), scale_a=self.xs, scale_b=scale_b, out_dtype=torch.bfloat16
        )

    def bf16(self) -> Callable[[], torch.Tensor]:
        """bf16 ``x @ w^T`` (``torch.mm``)."""
        wb = self.w.to(torch.bfloat16)
        return lambda: torch.mm(self.x, wb.t())

    def twin(self) -> torch.Tensor:
        """The pure-torch twin's fp32 output."""
        return fp8_gemm_ref(self.xq, self.xs, self.wq, self.ws, self.block, torch.float32)

    def check(self, got: torch.Tensor, want: torch.Tensor, label: str) -> None:
        """Raise unless a launch's output ``got`` is within 1e-2 (rel. RMS) of the twin's ``want``."""
        err = rel_rms(got.float(), want)
        if not err < 1e-2:
            raise AssertionError(f"{label}: {err:.3g} (rel. RMS) off the twin")


def tma_row(name: str, n: int, k: int, m: int, fmt: str, w: torch.Tensor) -> dict[str, Any]:
    """The GEMM alone at ``m`` tokens: the grid GEMM's tile for ``m`` (``gemm_tile``), cuBLASLt (per channel:
    row-wise ``torch._scaled_mm``), every :func:`tma_tiles` launch (each checked against the twin first) and
    bf16 mm."""
    ops = Fp8Operands.make(w, m, fmt)
    row: dict[str, Any] = dict(kind="tma", name=name, m=m, n=n, k=k, format=fmt)
    row["triton_us"] = round(bench_graph(ops.grid(ops.grid_tile())), 2)  # the grid GEMM, its tile for m
    if ops.block is None and ops.x.is_cuda:
        row["scaled_mm_us"] = round(bench_graph(ops.cublaslt()), 2)
    want = ops.twin()
    times: dict[str, float] = {}
    for tname, tile in tma_tiles(m, ops.block).items():
        fn = ops.tma(tile)
        try:
            got = fn()
        except Exception as e:  # noqa: BLE001 - triton's OutOfResources and compile errors alike
            why = [line for line in str(e).splitlines() if line.strip()][-3:]
            print(f"tma tile {tname}: {type(e).__name__}: {' | '.join(why)[:400]}", flush=True)
            continue
        ops.check(got, want, f"{name} m={m} {fmt}: TMA tile {tname}")
        times[tname] = round(bench_graph(fn), 2)
    row["tma_tiles_us"] = times
    row["bf16_us"] = round(bench_graph(ops.bf16()), 2)
    if times:
        best = min(times, key=times.get)
        row["tma_best"], row["tma_best_us"] = best, times[best]
        row["tma_speedup"] = round(row["bf16_us"] / times[best], 3)
    row["triton_speedup"] = round(row["bf16_us"] / row["triton_us"], 3)
    return row
