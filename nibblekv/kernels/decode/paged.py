"""The ``paged`` / ``rows`` decode kernel (split-K flash-decoding with ``tl.dot``) over a BF16 / FP8 /
NVFP4 cache plus a bf16 tail: ``decode_triton``'s kernel at head_dim 256, and the ``paged`` /
``rows`` kernels at any head_dim.

Grid ``(B, kv_heads, num_splits [+1])``: one program reads one KV head's pages once for all ``G`` query
heads of its GQA group (padded to ``BH >= 16`` rows for ``tl.dot``), over one slice of the request's
main-pool tokens; with a tail pool, the extra last split attends over the tail (its newest tokens).
Each program writes an fp32 partial output and its log-sum-exp (base 2); ``decode.combine._combine_kernel``
merges the splits. Dequantization happens in registers (``load_kv_halves``); global scales fold into the fp32
softmax scale and output scale.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._common import (
    global_scales,
    load_kv_halves,
    load_kv_pages,
    load_v_pages,
    load_v_rows,
    online_softmax_step,
    split_range,
    split_slot,
)


@triton.jit
def _decode_block(
    n0, end, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok, sc_page, sc_tok,
    head_off, shead_off, pt_ptr,
    D: tl.constexpr, PAGE: tl.constexpr, BN: tl.constexpr, FMT: tl.constexpr,
    INTERP: tl.constexpr, PAGED: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    """Keys ``[n0, n0 + BN)`` of one KV head: load, dequantize, one online-softmax step.

    MASKED=False needs ``n0 + BN <= end`` (no load masks at all); MASKED=True masks keys ``>= end``.
    PAGED=True (whole-page tiles) needs MASKED=False.
    """
    idx = n0 + tl.arange(0, BN)
    nmask = idx < end
    if PAGED:  # whole pages: one page-table entry and one base address per page
        NPG: tl.constexpr = BN // PAGE
        pidx = n0 // PAGE + tl.arange(0, NPG)
        page = tl.load(pt_ptr + pidx).to(tl.int64)
        row = page * s_page + head_off
        srow = page * sc_page + shead_off
        ka, kb = load_kv_pages(k_ptr, ks_ptr, row, srow, None, D, PAGE, FMT, INTERP)
        v = load_v_pages(v_ptr, vs_ptr, row, srow, D, PAGE, FMT, INTERP)
    else:
        # NOTE: masked keys load as zeros (page-table reads too): stale V bytes could hold NaN, and 0 * NaN
        # would poison the sum even with p = 0.
        page = tl.load(pt_ptr + idx // PAGE, mask=nmask, other=0).to(tl.int64)
        tok = (idx % PAGE).to(tl.int64)
        row = page * s_page + head_off + tok * s_tok
        srow = page * sc_page + shead_off + tok * sc_tok
        ka, kb = load_kv_halves(k_ptr, ks_ptr, row, srow, nmask, D, FMT, INTERP)
        v = load_v_rows(v_ptr, vs_ptr, row, srow, nmask, D, FMT, INTERP)
    return online_softmax_step(qa, qb, ka, kb, v, nmask[None, :], m, l, acc, qk_scale)


@triton.jit
def _decode_segment(
    q_ptr,
    s_qh,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    s_page,
    s_head,
    s_tok,
    sc_page,
    sc_head,
    sc_tok,
    pt_ptr,
    start,
    end,
    h,
    qk_scale,
    out_scale,
    o_ptr,
    lse_ptr,
    s_os,
    G: tl.constexpr,
    BH: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BN: tl.constexpr,
    FMT: tl.constexpr,
    INTERP: tl.constexpr,
    PAGED: tl.constexpr,
):
    """Attend the group's query rows over tokens ``[start, end)`` of one pool; store partial o / lse."""
    HALF: tl.constexpr = D // 2
    offs_g = tl.arange(0, BH)
    gmask = offs_g < G
    offs_j = tl.arange(0, HALF)
    if FMT == 2:  # NVFP4 tiles come as (even, odd) elements of head_dim
        col_a = offs_j * 2
        col_b = offs_j * 2 + 1
    else:  # other formats as (first half, second half)
        col_a = offs_j
        col_b = offs_j + HALF
    q_rows = q_ptr + (h * G + offs_g)[:, None] * s_qh
    qa = tl.load(q_rows + col_a[None, :], mask=gmask[:, None], other=0.0)
    qb = tl.load(q_rows + col_b[None, :], mask=gmask[:, None], other=0.0)

    m = tl.full([BH], float("-inf"), tl.float32)
    l = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, D], tl.float32)
    head_off = h.to(tl.int64) * s_head
    shead_off = h.to(tl.int64) * sc_head
    # Full blocks run unmasked; the last, partial block (if any) runs once more with per-token masks.
    full_end = start + (end - start) // BN * BN
    if (
        INTERP
    ):  # NOTE: triton 3.6's interpreter cannot run `for` over loaded bounds; GPUs need `for` to pipeline
        n0 = start
        while n0 < full_end:
            m, l, acc = _decode_block(
                n0, end, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok,
                sc_page, sc_tok, head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, INTERP, PAGED, False,
            )  # fmt: skip
            n0 += BN
    else:
        for n0 in range(start, full_end, BN):
            m, l, acc = _decode_block(
                n0, end, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok,
                sc_page, sc_tok, head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, INTERP, PAGED, False,
            )  # fmt: skip
    if full_end < end:
        m, l, acc = _decode_block(
            full_end, end, qa, qb, m, l, acc, qk_scale, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_tok,
            sc_page, sc_tok, head_off, shead_off, pt_ptr, D, PAGE, BN, FMT, INTERP, False, True,
        )  # fmt: skip

    # An empty segment stores lse = -inf and o = 0, which the combine step weighs as nothing.
    inv = tl.where(l > 0, out_scale / tl.maximum(l, 1e-30), 0.0)
    lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
    o_rows = o_ptr + offs_g[:, None] * s_os
    tl.store(o_rows + tl.arange(0, D)[None, :], acc * inv[:, None], mask=gmask[:, None])
    tl.store(lse_ptr + offs_g * (s_os // D), lse, mask=gmask)


@triton.jit
def _decode_kernel(
    q_ptr, s_qb, s_qh,
    k_ptr, v_ptr, ks_ptr, vs_ptr, g_ptr,
    s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
    pt_ptr, s_pt, lens_ptr,
    tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr,
    o_ptr, lse_ptr, sm_scale,
    HQ: tl.constexpr, G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, TPAGE: tl.constexpr, BN: tl.constexpr, TBN: tl.constexpr,
    NUM_SPLITS, HAS_TAIL: tl.constexpr,
    FMT: tl.constexpr, INTERP: tl.constexpr, PAGED: tl.constexpr, TPAGED: tl.constexpr,
):  # fmt: skip
    b, h, sp, S_TOT, q_base, o_base, lse_base = split_slot(
        q_ptr, s_qb, o_ptr, lse_ptr, NUM_SPLITS, HQ, G, D, HAS_TAIL,
    )  # fmt: skip
    if HAS_TAIL and sp < 0:
        n = tl.load(tlens_ptr + b)
        _decode_segment(
            q_base, s_qh, tk_ptr, tv_ptr, tk_ptr, tv_ptr, t_page, t_head, t_tok, 0, 0, 0,
            tpt_ptr + b.to(tl.int64) * s_tpt, 0, n, h, sm_scale * 1.4426950408889634, 1.0,
            o_base, lse_base, S_TOT * D,
            G, BH, D, TPAGE, TBN, 0, INTERP, TPAGED,
        )  # fmt: skip
    else:
        start, end = split_range(tl.load(lens_ptr + b), sp, NUM_SPLITS, BN)
        gk, gv = global_scales(g_ptr, FMT)
        _decode_segment(
            q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
            pt_ptr + b.to(tl.int64) * s_pt, start, end, h, sm_scale * 1.4426950408889634 * gk, gv,
            o_base, lse_base, S_TOT * D,
            G, BH, D, PAGE, BN, FMT, INTERP, PAGED,
        )  # fmt: skip
