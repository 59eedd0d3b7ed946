"""Decode launch configuration: which kernel serves a batch (``select_decode``) and split counts; each
family's tuned knobs are ``decode.knobs`` (``base_config``). The NOTEs give the measurements behind each
choice (docs/results.md, what we tried, has the rest).
"""

from __future__ import annotations

import torch
import triton

from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels._common import FMT_NVFP4, fmt_code, interpreting, num_sms
from nibblekv.kernels.decode.knobs import BALANCED_L2, WIDE_L2, base_config
from nibblekv.kernels.decode.launch_config import DecodeConfig, DecodeKernel
from nibblekv.kernels.ptx.ring import STAGE_BYTES

# NOTE: "tok" (decode_tok) is the default where "mma" does not apply: on the H200, fraction of the 4.63 TB/s
# read ceiling at B64x32K / B8x32K /
# B32x8K / B1x128K, "paged" -> "tok":
# BF16 .59/.53/.55/.43 -> .97/.88/.86/.78, FP8 .39/.36/.36/.35 -> .79/.65/.65/.60,
# NVFP4 .24/.22/.22/.21 -> .30/.28/.27/.22 (each checked against the reference on the GPU first).
# NOTE: head dims where "tok" is the default (its inline-PTX paths cannot run in the interpreter; each passed
# the GPU tests and was timed): at 64 (H200, B64x32K / B8x32K / B32x8K / B1x128K) "paged" -> "tok": FP8
# .43/.39/.39/.38 -> .91/.69/.69/.61, BF16 .54/.48/.50/.49 -> .93/.75/.77/.73. At 256 (H100, GQA 6,
# B64x8K / B8x32K / B1x256K, bench_kernels --head-dims 256): FP8 .60/.56/.60 -> .85/.78/.90, BF16
# .78/.73/.76 -> .92/.89/.94 (GQA 8 alike); gated by test_decode_tok_head_dim_256_gqa_6_and_8 and
# test_extend_decode_fp8_head_dim_256 (GPU).
TOK_VERIFIED_HEAD_DIMS = (64, 128, 256)
# NOTE: decode_mma at head_dim 64 (two tokens a row) is the NVFP4 default (same shapes): "paged"
# .23/.20/.20/.16 -> .69/.56/.55/.45 (3x); it matched the reference on the GPU (rel. RMS 1.7e-3). Head_dim
# 256 (decode.mma256; GQA <= 8; H100, GQA 6 B64x8K / B8x32K / B1x256K): "paged" .25/.23/.24 -> .83/.80/.81
# of the ceiling; test_decode_mma_head_dim_256 et al. gate it.
MMA_VERIFIED_HEAD_DIMS = (64, 128, 256)


def default_num_splits(
    batch: int, kv_heads: int, max_len: int | None = None, block_n: int = 128, per_sm: int = 16,
    cap: int = 64, wave_ctas: int = 0,
) -> int:
    """Splits per request so the grid has ~16 programs per SM (132 SMs on an H200).

    Many equal programs keep the last wave short (a grid of ~1.3 waves left a third of the GPU idle on
    the H200). ``max_len`` (a host int, if the caller knows it) caps splits so each gets
    >= 2 key blocks; empty splits exit at once, so over-splitting short contexts is cheap.
    ``wave_ctas`` (> 0): with >= 64 (request, KV head) pairs, the splits that fill ONE
    wave of that many resident programs per SM instead, where that wave is >= 90% full.
    """
    sms = num_sms()
    pairs = batch * kv_heads
    one_wave = max(1, min(cap, wave_ctas * sms // pairs)) if wave_ctas > 0 else 0
    if 64 <= pairs <= wave_ctas * sms and pairs * one_wave >= 0.9 * wave_ctas * sms:
        # NOTE: FP8 decode_tok holds ~2 programs per SM (210 registers x 4 warps): ~16 waves of short splits
        # paid each program's pipeline ramp with nothing beside it -- 13-27 us per call at 256K-token shapes.
        # Only a wave >= 90% full: 208 pairs (B=26 x 32K) in 208 programs read .865 vs .891 with 11 splits
        return one_wave
    splits = max(1, min(cap, triton.cdiv(per_sm * sms, pairs)))
    if max_len is not None:
        splits = max(1, min(splits, triton.cdiv(max_len, 2 * block_n)))
    return splits


def graph_num_splits(batch: int, lo: int, kv_heads: int, block_n: int, cap: int, wave_ctas: int) -> int:
    """``default_num_splits`` for a launch that serves ``lo``..``batch`` requests (a CUDA graph replayed
    with padding rows): the one-wave rule only where the smallest batch gets the same splits (fills it
    too)."""
    splits = default_num_splits(batch, kv_heads, None, block_n, cap=cap, wave_ctas=wave_ctas)
    if wave_ctas and splits != default_num_splits(lo, kv_heads, None, block_n, cap=cap, wave_ctas=wave_ctas):
        return default_num_splits(batch, kv_heads, None, block_n, cap=cap)
    return splits


def mma_columns(head_dim: int) -> int:
    """Query columns per KV head that decode_mma scores in one warp: 16 at head_dim 128 (8 by ``S^T = K Q^T``,
    one ``mma.sync`` n-dimension; 9-16 by ``S = Q K^T``, ``decode_mma16``), 4 at 64 (two tokens a row use two
    columns each), 8 at 256 (``S^T = K Q^T`` on two 128-dim halves, ``decode.mma256``), 0 where it does not
    run."""
    return {128: 16, 64: 4, 256: 8}.get(head_dim, 0)


def mma_narrow_columns(head_dim: int) -> int:
    """Query columns per KV head that decode_mma scores as ``S^T = K Q^T`` (8 at head_dim 128, 4 at 64); more
    (up to ``mma_columns``) run as ``decode_mma16`` with ``mma_wide_config``."""
    return min(mma_columns(head_dim), 8)


def mma_wide_config(cfg: DecodeConfig) -> DecodeConfig:
    """``cfg`` for ``decode_mma16`` (a GQA group of 9-16 columns): ``wppsm`` programs per SM (its 64
    accumulators), the L2 prefetch, the tail in its own launch, per-pair splits."""
    l2 = WIDE_L2 if cfg.l2_ahead is None else cfg.l2_ahead
    return cfg.replace(kernel=DecodeKernel.MMA16, ppsm=cfg.wppsm, l2_ahead=l2, tin=0, balanced=0)


def _mma_unsupported(cache: LayerKV, g: int) -> str | None:
    """Why ``decode_mma`` cannot run on this pool (None if it can): NVFP4, head_dim 128 with a GQA group
    <= 16, head_dim 256 with a group <= 8 or head_dim 64 with a group <= 4 and an even page size (two tokens
    a row), packed rows, pages and heads 8-byte aligned (the kernel reads them as uint64 / uint16 words)."""
    lay = cache.layout
    d = lay.head_dim
    fits = 0 < g <= mma_columns(d) and (d != 64 or lay.page_size % 2 == 0)
    if fmt_code(cache.dtype) != FMT_NVFP4 or not fits or cache.k_scale is None:
        return (
            "needs an NVFP4 pool with head_dim 128 and a GQA group <= 16, head_dim 256 and a group <= 8, or "
            "head_dim 64, a group <= 4 and even pages"
        )
    ds, ss = cache.k_data.stride(), cache.k_scale.stride()
    packed = ds[2] == lay.head_dim // 2 and ss[2] == lay.head_dim // 16
    aligned = all(x % 8 == 0 for x in ds[:2]) and all(x % 2 == 0 for x in ss[:2])
    aligned = aligned and cache.k_data.data_ptr() % 8 == 0 and cache.v_data.data_ptr() % 8 == 0
    aligned = aligned and ds[0] < 2**31 and ss[0] < 2**31  # NOTE: _page_addr multiplies 32-bit page strides
    if not (packed and aligned) or cache.k_scale.data_ptr() % 2:
        return "needs packed NVFP4 rows, 8-byte aligned pages and heads, page strides below 2**31 bytes"
    return None


def l2_bulk_bytes(cache: LayerKV, cfg: DecodeConfig, group: int) -> int:
    """``DecodeConfig.l2_bulk``: the bytes of one (page, KV head) run (K rows, K scales, V rows, V scales
    side by side) that each L2 prefetch of ``decode_mma`` / ``decode_balanced`` copies in bulk; 0 where
    off. Raises where the prefetch it changes does not run or the pool is not one run a (page, KV head)."""
    if not cfg.l2_bulk:
        return 0
    lay = cache.layout
    if not cfg.l2_ahead or lay.page_size != 16 or group > 8 or lay.head_dim not in (128, 256):
        raise ValueError(
            "l2_bulk needs the L2 prefetch (l2_ahead > 0) of decode_mma / decode_balanced: 16-token pages, "
            f"head_dim 128 or 256, GQA <= 8 (l2_ahead {cfg.l2_ahead}, page {lay.page_size}, head_dim "
            f"{lay.head_dim}, GQA {group})"
        )
    _check_page_runs(cache, "l2_bulk")
    return 2 * lay.head_run_bytes()


def _check_page_runs(cache: LayerKV, what: str) -> None:
    """Raise unless the pool is in its own page layout: K rows, K scales, V rows, V scales of each (page, KV
    head) side by side, what a bulk copy of one run takes."""
    if cache.pages is None or cache.k_data.data_ptr() != cache.pages.data_ptr():
        raise ValueError(f"{what} needs an NVFP4 pool in its own page layout (LayerKV.allocate)")


# NOTE: an H100 / H200 SM's shared memory, and what the driver reserves a program (228 / 1 KB)
SM_SHARED_BYTES = 228 * 1024
PROGRAM_RESERVED_BYTES = 1024


def smem_ring_stages(cache: LayerKV, cfg: DecodeConfig, group: int, per_sm: int) -> int:
    """``DecodeConfig.smem_stages``: the stages of the shared-memory ring ``decode_mma`` /
    ``decode_balanced`` read their tiles through; 0 where off. Raises where the ring cannot serve the pool:
    each stage is whole (page, KV head) runs (one 16-token page a tile, the pool in its own page layout),
    one warp a program, GQA <= 8, head_dim 128 or 256 -- or where ``per_sm`` programs' rings do not fit an
    SM (the one-wave grid would take two waves)."""
    if not cfg.smem_stages:
        return 0
    need = per_sm * (cfg.smem_stages * (STAGE_BYTES + 8) + PROGRAM_RESERVED_BYTES)
    if need > SM_SHARED_BYTES:
        raise ValueError(
            f"smem_stages {cfg.smem_stages} at {per_sm} programs an SM needs {need} bytes of shared memory "
            f"an SM (> {SM_SHARED_BYTES}): fewer stages or programs (ppsm / bal_ppsm)"
        )
    lay = cache.layout
    if lay.page_size != 16 or group > 8 or lay.head_dim not in (128, 256) or cfg.num_warps != 1:
        raise ValueError(
            "smem_stages needs decode_mma / decode_balanced on 16-token pages, head_dim 128 or 256, "
            f"GQA <= 8, one warp a program (page {lay.page_size}, head_dim {lay.head_dim}, GQA {group}, "
            f"num_warps {cfg.num_warps})"
        )
    _check_page_runs(cache, "smem_stages")
    return cfg.smem_stages


def prefetch_args(cache: LayerKV, cfg: DecodeConfig, group: int, per_sm: int) -> dict[str, int]:
    """``decode_mma`` / ``decode_balanced`` launches' prefetch constexprs ``PF``, ``L2``, ``L2B``, ``SMS``:
    the shared-memory ring (``smem_ring_stages``) replaces the register and L2 prefetches where on."""
    sms = smem_ring_stages(cache, cfg, group, per_sm)
    if sms:
        return {"PF": 0, "L2": 0, "L2B": 0, "SMS": sms}
    return {"PF": cfg.pf, "L2": cfg.l2_ahead or 0, "L2B": l2_bulk_bytes(cache, cfg, group), "SMS": 0}


def _mma_max_registers(per_sm: int) -> int:
    """Registers per thread that let ``per_sm`` one-warp programs share an SM (allocated in 8s).

    NOTE: an SM's 64K registers are four 16K files, one per scheduler, and each warp lives in one of them:
    ``ceil(per_sm / 4)`` warps must fit 16K. 14 programs at 144 registers fit 64K but only 3 a scheduler, so
    12 ran and the grid planned for 14 took two waves: 0.42-0.56 of the H200's ceiling vs 0.54-0.77 at
    ppsm 16 or 12 (the defaults: 12, 8 at head_dim 256)."""
    return max(24, min(255, 16384 // (32 * -(-per_sm // 4))) // 8 * 8)


def mma_num_splits(batch: int, kv_heads: int, num_warps: int, per_sm: int, slots: int = 256) -> int:
    """Splits for ``decode_mma``: ``per_sm`` warps per SM in all, rounded DOWN (whole waves).

    Every warp has the same work, so the grid should be whole waves: with ~16 warps resident per SM (128
    registers), a grid of 1.1 waves ran at 0.50 of the H200's read ceiling and 2.06 waves at 0.57
    (B=32 x 8K). The bf16 tail is one more program per (request, KV head) past these waves
    (``TAIL_MMA``) or its own launch (``decode_tail_kernel``). Capped at ``slots`` partial slots per head
    (``DecodeConfig.mma_slots``; each warp writes one, the combine step reads them all).
    NOTE: at 256 slots, 8 programs per SM (head_dim 256) and 2 pairs (one request, 2 KV heads) fill half the
    1,056 slots of an H100 run: 0.58 of the ceiling against 0.81 with 4 pairs (GQA 6); 512 at head_dim 256.
    """
    sms = num_sms()
    return max(1, min(slots // num_warps, per_sm * sms // (batch * kv_heads * num_warps)))


def combine_dim_block(rows: int, slots: int, d: int) -> int:
    """Dims per combine program for ``rows`` (request, head) pairs of ``slots`` partials each.

    NOTE: split the dims only as far as the grid needs to cover the GPU (~2 programs per SM): one program
    per head looping over 256 slots was latency-bound at B=1 (32 programs), while splitting every head 8
    ways whenever slots > 16 gives B=8 x GQA 8 4096 programs for 33 slots (the time per launch is not
    measured apart -- compare with ``DecodeConfig.combine_db=16``).
    """
    if slots <= 16:
        return d
    sms = num_sms()
    ways = min(d // 16, triton.next_power_of_2(triton.cdiv(2 * sms, max(rows, 1))))
    return d // ways


def default_kernel(fmt: int, d: int, interp: bool) -> DecodeKernel:
    """The default family for a pool (before ``select_decode`` checks that ``mma`` can run on it)."""
    if fmt == FMT_NVFP4 and d in MMA_VERIFIED_HEAD_DIMS and not interp:
        return DecodeKernel.MMA
    return DecodeKernel.TOK if interp or d in TOK_VERIFIED_HEAD_DIMS else DecodeKernel.PAGED


def select_decode(
    cache: LayerKV, group: int, pairs: int, tail: LayerKV | None, config: DecodeConfig | None = None
) -> DecodeConfig:
    """THE choice of decode kernel: (kv dtype, head_dim, GQA group, (request, KV head) pairs, bf16 tail) ->
    a launch config. ``config`` (optional) asks for a family and knobs; it is resolved the same way (an
    ``MMA`` config becomes ``MMA16`` / ``BALANCED`` as below) and raises where its kernel cannot run.

    ======================  ==========  ====================  ==========  =====================================
    pool                    head_dim    GQA group (columns)   pairs       kernel
    ======================  ==========  ====================  ==========  =====================================
    NVFP4 (packed, aligned) 128         <= 8                  < 152       MMA (decode_mma), tail in its grid
    NVFP4 (packed, aligned) 128         <= 8                  >= 152      BALANCED (decode_balanced), L2 pf
    NVFP4 (packed, aligned) 128         9-16                  any         MMA16 (decode_mma16), tail launch
    NVFP4, even pages       64          <= 4                  any         MMA (two tokens a row, PAIR)
    NVFP4 (packed, aligned) 256         <= 8                  < 208       MMA (two halves), tail in its grid
    NVFP4 (packed, aligned) 256         <= 8                  >= 208      BALANCED (two halves)
    FP8 / BF16; NVFP4 else  64-256      any (> 16: chunks)    any         TOK (decode_tok)
    any                     other       any (> 16: chunks)    any         PAGED (decode_paged)
    ======================  ==========  ====================  ==========  =====================================

    Under the interpreter (CPU tests) the default is TOK. The bf16 tail runs as ``tail_splits`` one-warp
    programs of decode_mma's grid where its rows are 16-byte aligned bf16 (``tin``), else as
    ``decode_tail_kernel`` beside it; BALANCED needs head_dim 128 or 256, one warp a program and the tail
    (if any) in the grid. MMA at head_dim 256 takes one tile a step (``tpi`` 1).
    """
    fmt, d = fmt_code(cache.dtype), cache.layout.head_dim
    interp = interpreting()
    cfg = config or base_config(default_kernel(fmt, d, interp), fmt, d, interp)
    if cfg.kernel is DecodeKernel.BALANCED:
        cfg = cfg.replace(kernel=DecodeKernel.MMA, balanced=1)
    elif cfg.kernel is DecodeKernel.MMA16:
        cfg = cfg.replace(kernel=DecodeKernel.MMA)
    if cfg.mma:
        why = _mma_unsupported(cache, group)
        if why and config is not None:
            raise ValueError(f"decode kernel 'mma' {why}")
        if why:  # the default where mma does not apply (a GQA group > 16, unaligned pools, odd pages)
            non_mma = DecodeKernel.TOK if interp or d in TOK_VERIFIED_HEAD_DIMS else DecodeKernel.PAGED
            return base_config(non_mma, fmt, d, interp)
        if d == 256 and cfg.tpi != 1:
            raise ValueError("decode kernel 'mma' at head_dim 256 takes tpi=1 (one tile a softmax step)")
        if group > mma_narrow_columns(d):
            cfg = mma_wide_config(cfg)
        pair = int(d == 64)
        in_grid = tail is not None and _mma_tail_in_grid(cfg, pair, tail)
        cfg = cfg.replace(tail_in_grid=in_grid)
        if cfg.kernel is DecodeKernel.MMA and _balanced(cfg, pair, tail is not None, in_grid, pairs):
            l2 = BALANCED_L2.get(d) if cfg.l2_ahead is None else cfg.l2_ahead
            cfg = cfg.replace(kernel=DecodeKernel.BALANCED, l2_ahead=l2)
    return cfg


def _mma_tail_in_grid(cfg: DecodeConfig, pair: int, tail: LayerKV) -> bool:
    """Whether decode_mma attends the bf16 tail as more one-warp programs of its grid (``TAIL_MMA``): ``tin``
    (default 1), one warp per program, bf16 rows whose addresses are 16-byte aligned (it reads them as
    vectors), packed rows; with ``PAIR`` (head_dim 64) even tail pages (two tokens a row). Else
    ``decode_tail_kernel`` runs beside it."""
    tk, tv, ts = tail.k_data, tail.v_data, tail.k_data.stride()
    aligned = all(x % 8 == 0 for x in ts[:3]) and tk.data_ptr() % 16 == 0 and tv.data_ptr() % 16 == 0
    ok = tk.dtype == torch.bfloat16 and tk.stride(-1) == 1 and aligned
    if pair:
        ok = ok and tail.page_size % 2 == 0 and ts[2] == tk.shape[-1]  # a row's two tokens adjacent
    return bool(cfg.tin) and cfg.num_warps == 1 and ok


def _balanced(cfg: DecodeConfig, pair: int, has_tail: bool, tail_in_grid: bool, pairs: int) -> bool:
    """Whether decode_mma runs token-balanced (``decode_balanced``): ``balanced=1``, or ``balanced=2``
    (default) from ``cfg.bal_pairs`` (request, KV head) pairs; head_dim 128 or 256 (no ``PAIR``), one warp per
    program, the bf16 tail (if any) in the grid. ``num_splits`` does not apply there (the warps split the
    batch's tiles, not each request)."""
    on = cfg.balanced == 1 or (cfg.balanced == 2 and pairs >= cfg.bal_pairs)
    return on and not pair and cfg.num_warps == 1 and (tail_in_grid or not has_tail)
