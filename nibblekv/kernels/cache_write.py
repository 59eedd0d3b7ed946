"""Cache write and tail demotion: quantize K/V rows on the fly into paged storage.

Both ops run one kernel, one program per stored row (token), that reads that row's K and V for every
KV head, quantizes them as the destination pool's dtype with the layer's global scales, and stores
data (+ NVFP4 block scales) at (page, head, offset). Results are bit-identical to
``nibblekv.formats`` (``tests/test_kernels_write.py`` checks every byte).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels._common import FMT_NVFP4, check_cache, fmt_code, scale_tensors
from nibblekv.kernels.types import LayerKV


@triton.jit
def _round_to_e4m3(x):
    """fp32 in [-448, 448] -> the nearest E4M3 value (ties to even), still fp32.

    NOTE: the CPU interpreter's fp32->fp8 cast does not round to nearest even; rounding here first makes
    the cast exact on both the interpreter and the GPU (whose cvt.rn would give the same bits anyway).
    """
    a = tl.abs(x)
    e = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)  # E4M3 subnormals share the 2**-9 spacing of the lowest binade
    big = ((e - 3 + 23 + 127) << 23).to(tl.float32, bitcast=True)  # ulp * 2**23
    r = (a + big) - big  # fp32 add rounds to a multiple of the E4M3 ulp, ties to even
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000  # keeps -0.0 (the reference stores it)
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), still fp32 (the interpreter's cast truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)


@triton.jit
def _quantize_store(
    src_ptr,
    dst_ptr,
    dst_scale_ptr,
    g_ptr,
    src_off,
    dst_off,
    dst_scale_off,
    s_src_head,
    s_dst_head,
    s_scale_head,
    valid,
    HKV: tl.constexpr,
    BLOCK_H: tl.constexpr,
    D: tl.constexpr,
    FMT: tl.constexpr,
):
    """Quantize one token's ``[HKV, D]`` rows and store them (all heads of K or of V)."""
    offs_h = tl.arange(0, BLOCK_H)
    hmask = (offs_h < HKV) & valid
    g = tl.load(g_ptr)
    if FMT == 2:
        NB: tl.constexpr = D // 16
        offs_b = tl.arange(0, NB)
        offs_e = tl.arange(0, 16)
        d = offs_b[:, None] * 16 + offs_e[None, :]
        ptrs = src_ptr + src_off + offs_h[:, None, None] * s_src_head + d[None, :, :]
        x = tl.load(ptrs, mask=hmask[:, None, None], other=0.0).to(tl.float32)
        limit = 2688.0 * g
        x = tl.where(x != x, 0.0, x)  # NaN -> 0
        x = tl.minimum(tl.maximum(x, -limit), limit)  # +-Inf -> +-limit, finite values clamped
        amax = tl.max(tl.abs(x), axis=2)
        s8 = _round_to_e4m3(tl.minimum(tl.math.div_rn(amax, g * 6.0), 448.0)).to(tl.float8e4nv)
        denom = s8.to(tl.float32) * g
        safe = tl.where(denom > 0, denom, 1.0)
        q = tl.where(denom[:, :, None] > 0, tl.math.div_rn(x, safe[:, :, None]), 0.0)
        mag = tl.abs(q)
        # Round to the E2M1 grid, ties to the even code index ('>' sends a tie down, '>=' up).
        idx = (
            (mag > 0.25).to(tl.int32)
            + (mag >= 0.75).to(tl.int32)
            + (mag > 1.25).to(tl.int32)
            + (mag >= 1.75).to(tl.int32)
            + (mag > 2.5).to(tl.int32)
            + (mag >= 3.5).to(tl.int32)
            + (mag > 5.0).to(tl.int32)
        )
        # NOTE: a value rounding to zero keeps a positive sign (code 0), as the reference does.
        code = idx | (((q < 0) & (idx > 0)).to(tl.int32) << 3)
        pairs = tl.reshape(code, [BLOCK_H, D // 2, 2])
        even, odd = tl.split(pairs)
        packed = (even | (odd << 4)).to(tl.uint8)
        offs_j = tl.arange(0, D // 2)
        tl.store(dst_ptr + dst_off + offs_h[:, None] * s_dst_head + offs_j[None, :], packed, mask=hmask[:, None])
        tl.store(
            dst_scale_ptr + dst_scale_off + offs_h[:, None] * s_scale_head + offs_b[None, :], s8, mask=hmask[:, None]
        )
    else:
        offs_d = tl.arange(0, D)
        ptrs = src_ptr + src_off + offs_h[:, None] * s_src_head + offs_d[None, :]
        x = tl.load(ptrs, mask=hmask[:, None], other=0.0).to(tl.float32)
        if FMT == 1:
            x = tl.where(x != x, 0.0, x)
            x = tl.math.div_rn(x, g)
            x = _round_to_e4m3(tl.minimum(tl.maximum(x, -448.0), 448.0))
        if dst_ptr.dtype.element_ty == tl.bfloat16:
            x = _round_to_bf16(x)
        out_ptrs = dst_ptr + dst_off + offs_h[:, None] * s_dst_head + offs_d[None, :]
        tl.store(out_ptrs, x.to(dst_ptr.dtype.element_ty), mask=hmask[:, None])


@triton.jit
def _store_rows_kernel(
    k_src,
    v_src,
    idx_ptr,
    dst_idx_ptr,
    k_dst,
    v_dst,
    k_dst_scale,
    v_dst_scale,
    g_ptr,
    s_src_a,
    s_src_tok,
    s_src_head,
    s_dst_page,
    s_dst_head,
    s_dst_tok,
    s_sc_page,
    s_sc_head,
    s_sc_tok,
    PAGE: tl.constexpr,
    HKV: tl.constexpr,
    BLOCK_H: tl.constexpr,
    D: tl.constexpr,
    FMT: tl.constexpr,
    DEMOTE: tl.constexpr,
):
    """One program per destination row.

    write (DEMOTE=False): row r is ``src[r]``, stored at slot ``idx_ptr[r]`` (skipped if < 0).
    demote (DEMOTE=True): row r is offset ``r % PAGE`` of tail page ``idx_ptr[r // PAGE]``, stored at the
    same offset of main page ``dst_idx_ptr[r // PAGE]``.
    """
    r = tl.program_id(0)
    if DEMOTE:
        i = r // PAGE
        off = r % PAGE
        src_off = tl.load(idx_ptr + i).to(tl.int64) * s_src_a + off * s_src_tok
        page = tl.load(dst_idx_ptr + i).to(tl.int64)
        valid = page >= 0
    else:
        slot = tl.load(idx_ptr + r).to(tl.int64)
        valid = slot >= 0
        slot = tl.maximum(slot, 0)
        page = slot // PAGE
        off = slot % PAGE
        src_off = r.to(tl.int64) * s_src_a
    dst_off = page * s_dst_page + off * s_dst_tok
    sc_off = page * s_sc_page + off * s_sc_tok
    _quantize_store(
        k_src, k_dst, k_dst_scale, g_ptr, src_off, dst_off, sc_off, s_src_head, s_dst_head, s_sc_head, valid,
        HKV, BLOCK_H, D, FMT,
    )  # fmt: skip
    _quantize_store(
        v_src, v_dst, v_dst_scale, g_ptr + 1, src_off, dst_off, sc_off, s_src_head, s_dst_head, s_sc_head, valid,
        HKV, BLOCK_H, D, FMT,
    )  # fmt: skip


def _check_head_dim(d: int) -> None:
    if d < 16 or d & (d - 1):
        raise ValueError(f"kernels need a power-of-two head_dim >= 16, got {d}")


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, cache: LayerKV, slots: torch.Tensor) -> None:
    """Triton twin of ``write_kv_ref``: rows ``k, v [T, kv_heads, D]`` -> cache at ``slots [T]`` (-1 = skip)."""
    check_cache(cache, "cache")
    lay = cache.layout
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (lay.num_kv_heads, lay.head_dim):
        raise ValueError(f"k/v must be [T, {lay.num_kv_heads}, {lay.head_dim}], got {tuple(k.shape)}, {tuple(v.shape)}")
    if slots.dim() != 1 or slots.shape[0] != k.shape[0] or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError("slots must be int32/int64 [T]")
    _check_head_dim(lay.head_dim)
    if k.stride() != v.stride() or k.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    if k.shape[0] == 0:
        return
    _launch(k, v, slots, slots, cache, k.stride(0), 0, k.stride(1), k.shape[0], demote=False)


def demote_pages_triton(tail: LayerKV, src_pages: torch.Tensor, cache: LayerKV, dst_pages: torch.Tensor) -> None:
    """Triton twin of ``demote_pages_ref``: quantize tail pages ``src_pages [N]`` into ``dst_pages [N]``."""
    check_cache(cache, "cache")
    check_cache(tail, "tail")
    if tail.page_size != cache.page_size:
        raise ValueError("tail and main pool must share the page size")
    if tail.dtype.quantized:
        raise ValueError("the tail pool must hold unquantized pages")
    if (tail.layout.num_kv_heads, tail.layout.head_dim) != (cache.layout.num_kv_heads, cache.layout.head_dim):
        raise ValueError("tail and main pool must share kv_heads and head_dim")
    if src_pages.shape != dst_pages.shape or src_pages.dim() != 1:
        raise ValueError("src_pages and dst_pages must be 1-D of equal length")
    _check_head_dim(cache.layout.head_dim)
    n = src_pages.shape[0]
    if n == 0:
        return
    s = tail.k_data.stride()
    _launch(tail.k_data, tail.v_data, src_pages, dst_pages, cache, s[0], s[2], s[1], n * cache.page_size, demote=True)


def _launch(
    k_src: torch.Tensor,
    v_src: torch.Tensor,
    idx: torch.Tensor,
    dst_idx: torch.Tensor,
    cache: LayerKV,
    s_src_a: int,
    s_src_tok: int,
    s_src_head: int,
    rows: int,
    demote: bool,
) -> None:
    lay = cache.layout
    ks, vs, (sp, sh, st) = scale_tensors(cache)
    d = cache.k_data.stride()
    fmt = fmt_code(cache.dtype)
    _store_rows_kernel[(rows,)](
        k_src, v_src, idx, dst_idx, cache.k_data, cache.v_data, ks, vs, cache.global_scale,
        s_src_a, s_src_tok, s_src_head, d[0], d[1], d[2], sp, sh, st,
        PAGE=lay.page_size, HKV=lay.num_kv_heads, BLOCK_H=triton.next_power_of_2(lay.num_kv_heads),
        D=lay.head_dim, FMT=fmt, DEMOTE=demote, num_warps=4 if fmt == FMT_NVFP4 else 2,
    )  # fmt: skip


__all__ = ["demote_pages_triton", "write_kv_triton"]
