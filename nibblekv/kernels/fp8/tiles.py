"""Launch configurations of the FP8 GEMMs: the grid GEMM's (:mod:`.gemm`) typed :class:`GemmTile` and its
default per token count, output width and K (:func:`gemm_tile`); the TMA GEMM's (:mod:`.gemm_tma`)
:class:`TmaTile` and where it is the default (:func:`tma_tile`) -- from ``benchmarks/bench_fp8.py``'s sweeps.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from nibblekv.kernels._common import num_sms


@dataclass(frozen=True)
class GemmTile:
    """One launch of the FP8 GEMM: ``block_m x block_n`` output tiles (K steps of the scale group), Triton's
    ``num_warps`` / ``num_stages``, ``split_k`` k-splits (1: none; more: fp32 partials + a sum kernel), and
    ``scale_ahead``: the block-scaled GEMM loads each k-step's scales the step before (tiles no wider than a
    weight block; off: in the step, whose scaling then waits on the load); ``swap_ab``: the MMA computes
    ``C^T = W X^T``, the weight tile its M side (wgmma needs 64 rows: ``block_n`` a multiple of 64 per
    warpgroup), so a batch of 16-32 tokens runs on Hopper's FP8 wgmma instead of fp16 ``mma.sync`` after
    converting both operands."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    scale_ahead: bool = True
    swap_ab: bool = False

    def __post_init__(self) -> None:
        pow2 = all(b >= 16 and not b & (b - 1) for b in (self.block_m, self.block_n))
        if not pow2 or min(self.num_warps, self.num_stages, self.split_k) < 1:
            raise ValueError(f"FP8 GEMM tile {self}: powers of two >= 16, positive warps, stages and splits")


@dataclass(frozen=True)
class TmaTile:
    """One launch of :func:`fp8_tma_gemm`: ``block_m x block_n`` output tiles, ``split_k`` k-splits, Triton's
    ``num_warps`` / ``num_stages``, ``programs_per_sm`` persistent programs an SM, ``warp_specialize``: a
    producer warp issuing the TMA loads (Triton's ``tl.range(warp_specialize=True)``), ``swap_ab``: the MMA
    computes ``C^T = W X^T``, the weight tile its M side (a batch of 1-32 tokens on FP8 wgmma, whose M is
    64 rows a warpgroup)."""

    block_m: int
    block_n: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4
    programs_per_sm: int = 1
    warp_specialize: bool = False
    swap_ab: bool = False

    def __post_init__(self) -> None:
        pow2 = all(b >= 16 and not b & (b - 1) for b in (self.block_m, self.block_n))
        if not pow2 or min(self.split_k, self.num_warps, self.num_stages, self.programs_per_sm) < 1:
            raise ValueError(f"FP8 TMA tile {self}: powers of two >= 16, positive splits, warps, stages")


# NOTE: the most tokens the TMA GEMM (kernels.fp8.gemm_tma) takes by default (swapped 16x64 weight tiles, 4
# k-splits, 2 programs an SM). H100, GEMM alone, us, qkv + o + gate_up + down, per channel / 128x128 blocks
# (bench_fp8 --tma, fp8-tma-h100.json): 1 token 92.4 / 91.9 against the grid GEMM's 97.4 / 97.8 (-5 / -6%;
# gate_up 46.3 vs 50.6), 2 tokens 94.1 / 96.2 vs 92.8 / 93.2, 8 tokens +6 / +7%, 16 tokens +9%; the engine's
# 8B decode step at 1 token 4.40 -> 4.13-4.16 ms (FP8 weights and KV). At 64-256 tokens (per channel) the
# best TMA tile beat both the grid GEMM and cuBLASLt at 3 of 12 shapes (down_proj at 128 tokens by 9%).
TMA_MAX_M = 1


def tma_tile(m: int, n: int, kblocks: int, block: bool = False) -> TmaTile | None:
    """The default :class:`TmaTile` for an ``m x n`` output over ``kblocks`` k-steps (``block``: the
    block-scaled GEMM), None where the grid GEMM (:func:`gemm_tile`) serves."""
    if m > TMA_MAX_M:
        return None
    return TmaTile(16, 64, split_k=4, num_warps=4, num_stages=4, programs_per_sm=2, swap_ab=True)


@functools.lru_cache(maxsize=1024)
def gemm_tile(m: int, n: int, kblocks: int, block: bool = False) -> GemmTile:
    """The default :class:`GemmTile` for an ``m x n`` output over ``kblocks`` k-blocks, ``block``: of the
    block-scaled GEMM (cached: launchers ask on every call).

    Up to 32 tokens the GEMM reads weights (FP8 tensor cores outrun HBM below ~400 flop/byte): 64-row weight
    tiles as the MMA's M side (``swap_ab``) and split-K give every SM a share of the weight stream, ~3
    programs per SM up to 16 tokens, ~2 up to 32; 33-256 tokens: 64x64 tiles in a 6-stage pipeline, no
    split (up to 64 tokens over fewer tiles than SMs: row-wise 8 stages, 32-wide tiles where 64-wide ones
    fill at most half the SMs; block-scaled, a long K: 4 splits, at most half as many tiles as SMs: 2).
    Prefill chunks (> 256 tokens) are compute-bound: 64x128 tiles, 4 warps, 3 stages -- 1.3-1.5x faster than
    128x128 / 8 warps at 512 and 8,192 tokens on an H200 (``benchmarks/bench_fp8.py`` times the others
    beside it)."""
    if m > 256:
        return GemmTile(64, 128, 4, 3)
    if m > 32:
        # NOTE: 64x64 tiles, 6 stages, no k-split: at 64-256 tokens on an H100 it beat every other decode tile
        # of bench_fp8's sweep at all four 8B projections but down at 256 (qkv / o at 64 tokens: 13.5 / 11.5
        # us vs 21.0 / 16.8 with 64x128, 4 stages and k-splits); a deep pipeline per program outdid more
        # programs even at 64 output tiles.
        tiles = triton.cdiv(n, 64)
        if m <= 64 and not block and tiles < num_sms():
            # NOTE: row-wise at 33-64 tokens over fewer 64-wide tiles than SMs: 8 stages, and 32-wide tiles
            # where 64-wide ones would fill at most half the SMs (o_proj, down_proj: 64). H100, GEMM alone,
            # against 64x64 / 6 stages (down: 4 k-splits): o 10.4 vs 12.0 us, down 26.0 vs 27.8, qkv (96
            # tiles) 13.1 vs 13.9 (bench_fp8's decode-tile sweep)
            return GemmTile(64, 32 if 2 * tiles <= num_sms() else 64, 4, 8)
        if m <= 64 and kblocks >= 64 and tiles < num_sms():
            # NOTE: a long K over fewer output tiles than SMs (down_proj: 112 k-blocks, 64 tiles) leaves SMs
            # idle without k-splits: at 64 tokens 4 splits, 4 stages took 28.4 vs 30.6 us on the H100 and
            # 21.7 vs 29.2 us on the H200 per channel, 30.9 vs 48.3 / 25.5 vs 48.7 with 128x128 blocks
            # (bench_fp8's decode-tile sweep); at 128 tokens no split tile won on both GPUs
            return GemmTile(64, 64, 4, 4, 4)
        if m <= 64 and block and 2 * tiles <= num_sms():
            # NOTE: the block-scaled GEMM waits on each k-step's product before scaling it: more programs hide
            # that. o_proj (64 tiles) at 64 tokens: 2 splits 13.4 vs 15.9 us (H100), 12.3 vs 15.8 (H200); the
            # row-wise GEMM there is faster without (11.0 vs 13.0 / 10.9 vs 11.8), qkv's 96 tiles equal. Timed
            # before the scales were loaded a step ahead; since, 13.2 us vs 12.8 for 64x32 / 8 stages (H100)
            return GemmTile(64, 64, 4, 4, 2)
        return GemmTile(64, 64, 4, 6)
    # NOTE: swapped (the 64-row weight tile is wgmma's M side), 4 stages, splits for ~3 programs an SM up to
    # 16 tokens and ~2 up to 32, a power of two. H100, GEMM alone, us, qkv / o / gate_up / down at 1 / 16 / 32
    # tokens: 12.8 / 10.2 / 49.6 / 23.4, 13.1 / 10.3 / 42.7 / 24.1, 13.6 / 11.1 / 43.8 / 25.2 against the
    # unswapped 16- / 32-row tiles (5 / 4 stages, ~4 / ~2 programs an SM) 14.5 / 11.9 / 48.4 / 25.9, 15.8 /
    # 13.8 / 47.4 / 27.6, 16.2 / 13.2 / 46.6 / 26.8 (per channel; block-scaled alike; bench_fp8's sweep)
    bm = 16 if m <= 16 else 32
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, 64)
    split = decode_splits(3 if m <= 16 else 2, tiles, kblocks, pow2=True)
    return GemmTile(bm, 64, 4, 4, split, swap_ab=True)


def decode_splits(per_sm: int, tiles: int, kblocks: int, pow2: bool = False) -> int:
    """k-splits for ~``per_sm`` programs an SM over ``tiles`` output tiles: at least 4 of the ``kblocks``
    k-blocks a split, at most 16 splits; ``pow2``: rounded down to a power of two."""
    split = max(1, min(triton.cdiv(per_sm * num_sms(), tiles), kblocks // 4, 16))
    return 1 << (split.bit_length() - 1) if pow2 else split
