"""Cache write and tail demotion: quantize K/V rows on the fly into paged storage.

Both ops run one kernel, one program per stored row (token), that reads that row's K and V for every
KV head, quantizes them as the destination pool's dtype with the layer's global scales, and stores
data (+ NVFP4 block scales) at (page, head, offset). ``four_over_six`` (a constexpr) picks NVFP4 block
scales by 4over6. Results are bit-identical to ``nibblekv.formats`` (``tests/test_kernels_write.py``
checks every byte).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.kv_view import TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels._common import FMT_NVFP4, check_cache, fmt_code, scale_tensors


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
def _nvfp4_encode(x, amax, g, TOP: tl.constexpr):
    """Blocks ``x [H, NB, 16]`` (sanitized), ``amax [H, NB]`` -> (scale ``e4m3(amax / (g * TOP))`` as fp32
    ``[H, NB]``, E2M1 grid index ``[H, NB, 16]`` int32, negative-sign flag ``[H, NB, 16]``)."""
    s = _round_to_e4m3(tl.minimum(tl.math.div_rn(amax, g * TOP), 448.0))
    denom = s * g
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
    return s, idx, (q < 0) & (idx > 0)


@triton.jit
def _nvfp4_sq_error(x, s, idx, neg, g):
    """Per-block squared error ``[H, NB]`` of codes ``(idx, neg)`` at scale ``s`` against ``x [H, NB, 16]``.

    Same fp32 operations as ``nvfp4._block_sq_error``: ``((value * s) * g - x) ** 2`` summed as the fixed
    tree of adjacent pairs. NOTE: bit-exact only without FMA contraction (the launcher passes
    ``enable_fp_fusion=False``) and only with this explicit order (``tl.sum``'s order is unspecified).
    """
    H: tl.constexpr = x.shape[0]
    NB: tl.constexpr = x.shape[1]
    f = idx.to(tl.float32)
    mag = tl.where(idx < 4, f * 0.5, tl.where(idx == 7, 6.0, f - 2.0))  # grid {0, .5, 1, 1.5, 2, 3, 4, 6}
    val = tl.where(neg, -mag, mag)
    d = (val * s[:, :, None]) * g - x
    e = d * d
    a, b = tl.split(tl.reshape(e, [H, NB, 8, 2]))
    e = a + b
    a, b = tl.split(tl.reshape(e, [H, NB, 4, 2]))
    e = a + b
    a, b = tl.split(tl.reshape(e, [H, NB, 2, 2]))
    e = a + b
    a, b = tl.split(e)
    return a + b


@triton.jit
def _sm_bytes(idx, neg):
    """Codes (magnitude ``idx`` 0..7, sign ``neg``) ``[H, W, 8]`` of W words -> their ``[H, 4W]`` bytes in
    the pool's sm order (``nibblekv.formats.sm_words``): element ``e``'s magnitude at bit ``mpos``, its sign
    at ``spos``."""
    e = tl.arange(0, 8)
    hi = 16 * ((e >> 1) & 1)
    mpos = hi + 9 - 9 * (e & 1) - 3 * (e >> 2) + 6 * (e & 1) * (e >> 2)
    spos = hi + 15 - (e & 1) - 3 * (e >> 2) + 2 * (e >> 2) * (e & 1)
    bits = (idx.to(tl.uint32) << mpos.to(tl.uint32)) | (neg.to(tl.uint32) << spos.to(tl.uint32))
    w = tl.sum(bits, axis=2)  # disjoint bits: the sum is their OR
    sh = (tl.arange(0, 4) * 8).to(tl.uint32)
    b = ((w[:, :, None] >> sh[None, None, :]) & 0xFF).to(tl.uint8)
    return tl.reshape(b, [idx.shape[0], idx.shape[1] * 4])


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
    FOUR_OVER_SIX: tl.constexpr,
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
        s, idx, neg = _nvfp4_encode(x, amax, g, 6.0)
        if FOUR_OVER_SIX:
            # 4over6: also map each block's amax to 4 and keep the scale with the lower squared error
            # (ties keep the standard one), exactly as ``nvfp4.quantize(..., four_over_six=True)``.
            s4, idx4, neg4 = _nvfp4_encode(x, amax, g, 4.0)
            better = _nvfp4_sq_error(x, s4, idx4, neg4, g) < _nvfp4_sq_error(x, s, idx, neg, g)
            s = tl.where(better, s4, s)
            idx = tl.where(better[:, :, None], idx4, idx)
            neg = tl.where(better[:, :, None], neg4, neg)
        s8 = s.to(tl.float8e4nv)  # exact: s is already an E4M3 value
        # NOTE: a value rounding to zero keeps a positive sign (code 0), as the reference does.
        packed = _sm_bytes(tl.reshape(idx, [BLOCK_H, D // 8, 8]), tl.reshape(neg, [BLOCK_H, D // 8, 8]))
        offs_j = tl.arange(0, D // 2)
        tl.store(
            dst_ptr + dst_off + offs_h[:, None] * s_dst_head + offs_j[None, :], packed, mask=hmask[:, None]
        )
        tl.store(
            dst_scale_ptr + dst_scale_off + offs_h[:, None] * s_scale_head + offs_b[None, :],
            s8,
            mask=hmask[:, None],
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
    FOUR_OVER_SIX: tl.constexpr,
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
    # NOTE: skipped rows do no work at all, not just masked memory ops: a CUDA-graph decode step launches
    # the demotion over a page per row every step though a request demotes once per page_size steps; the
    # (4over6) quantization of every skipped row cost nvfp4 ~0.1 ms of a 5 ms 8B step at 1-2 requests.
    if valid:
        _quantize_store(
            k_src, k_dst, k_dst_scale, g_ptr, src_off, dst_off, sc_off, s_src_head, s_dst_head, s_sc_head, valid,
            HKV, BLOCK_H, D, FMT, FOUR_OVER_SIX,
        )  # fmt: skip
        _quantize_store(
            v_src, v_dst, v_dst_scale, g_ptr + 1, src_off, dst_off, sc_off, s_src_head, s_dst_head, s_sc_head,
            valid, HKV, BLOCK_H, D, FMT, FOUR_OVER_SIX,
        )  # fmt: skip


def _check_head_dim(d: int) -> None:
    if d < 16 or d & (d - 1):
        raise ValueError(f"kernels need a power-of-two head_dim >= 16, got {d}")


def write_kv_triton(
    k: torch.Tensor, v: torch.Tensor, cache: LayerKV, slots: torch.Tensor, four_over_six: bool = False
) -> None:
    """Triton twin of ``write_kv_ref``: rows ``k, v [T, kv_heads, D]`` -> cache at ``slots [T]`` (-1 = skip).

    ``four_over_six`` picks NVFP4 block scales by 4over6 (ignored for other dtypes, as by the reference).
    """
    check_cache(cache, "cache")
    lay = cache.layout
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (lay.num_kv_heads, lay.head_dim):
        raise ValueError(
            f"k/v must be [T, {lay.num_kv_heads}, {lay.head_dim}], got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if slots.dim() != 1 or slots.shape[0] != k.shape[0] or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError("slots must be int32/int64 [T]")
    _check_head_dim(lay.head_dim)
    if k.stride() != v.stride() or k.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    if k.shape[0] == 0:
        return
    _launch(k, v, slots, slots, cache, k.stride(0), 0, k.stride(1), k.shape[0], False, four_over_six)


def demote_pages_triton(moves: TailDemotion, four_over_six: bool = False) -> None:
    """Triton twin of ``demote_pages_ref``: quantize the tail pages ``moves.src_pages`` into ``dst_pages``."""
    tail, src_pages, cache, dst_pages = moves.tail, moves.src_pages, moves.cache, moves.dst_pages
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
    rows = n * cache.page_size
    _launch(
        tail.k_data, tail.v_data, src_pages, dst_pages, cache, s[0], s[2], s[1], rows, True, four_over_six
    )


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
    four_over_six: bool,
) -> None:
    lay = cache.layout
    ks, vs, (sp, sh, st) = scale_tensors(cache)
    d = cache.k_data.stride()
    fmt = fmt_code(cache.dtype)
    _store_rows_kernel[(rows,)](
        k_src, v_src, idx, dst_idx, cache.k_data, cache.v_data, ks, vs, cache.global_scale,
        s_src_a, s_src_tok, s_src_head, d[0], d[1], d[2], sp, sh, st,
        PAGE=lay.page_size, HKV=lay.num_kv_heads, BLOCK_H=triton.next_power_of_2(lay.num_kv_heads),
        D=lay.head_dim, FMT=fmt, DEMOTE=demote, FOUR_OVER_SIX=four_over_six and fmt == FMT_NVFP4,
        num_warps=4 if fmt == FMT_NVFP4 else 2,
        enable_fp_fusion=False,  # no FMA contraction: 4over6's error sums must round like the reference's
    )  # fmt: skip


__all__ = ["demote_pages_triton", "write_kv_triton"]
