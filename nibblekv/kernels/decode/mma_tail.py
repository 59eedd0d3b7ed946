"""``decode_mma``'s bf16 tail: one more one-warp program of the grid attends a request's newest tokens
(bf16 ``mma.sync`` on the same fragment layout as the NVFP4 main pool), or ``decode_tail_kernel``, its own
launch beside the main kernel (where the tail does not run in-grid).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_step import _finish, _step_max
from nibblekv.kernels.decode._mma_tile import _online_init
from nibblekv.kernels.decode.tok import _tok_segment
from nibblekv.kernels.ptx.mma import _ld4, _mma_bf16, _p_frag_bf16


@triton.jit
def _bf16_bits(x):
    """fp32 -> bf16 bits (round to nearest even; finite values) in a uint32 (exact for bf16 inputs)."""
    b = x.to(tl.uint32, bitcast=True)
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16


@triton.jit
def _q_bf16(qrow, d, qm):
    """bf16 pair (Q[d], Q[d + 1]) of this lane's head as one B-fragment register (zeros past the group)."""
    a = tl.load(qrow + d, mask=qm, other=0.0).to(tl.float32)
    b = tl.load(qrow + d + 1, mask=qm, other=0.0).to(tl.float32)
    return _bf16_bits(a) | (_bf16_bits(b) << 16)


@triton.jit
def _lo(x, y):
    """Low bf16 of ``x`` and of ``y`` -> (x, y): one dim of two tokens (a V^T A-fragment register)."""
    return (x & 0xFFFF) | (y << 16)


@triton.jit
def _hi(x, y):
    """High bf16 of ``x`` and of ``y`` -> (x, y)."""
    return (x >> 16) | (y & 0xFFFF0000)


@triton.jit
def _tail_rows(base, tpt_ptr, idx, n, t_page, t_tok, TPAGE: tl.constexpr, pg=0, ONE: tl.constexpr = 0):
    """Token ``idx`` of a tail (page table ``tpt_ptr``, ``n`` tokens) -> (its row's address, valid).
    ``ONE``: the token is on page ``pg`` (already loaded: the tile lies in one page)."""
    valid = idx < n
    if ONE:
        page = pg
    else:
        page = tl.load(tpt_ptr + idx // TPAGE, mask=valid, other=0).to(tl.int64)
    return base + page * t_page + (idx % TPAGE).to(tl.int64) * t_tok, valid


@triton.jit
def _ld16(ptr, m):
    """16 bf16 at ``ptr`` (32-byte aligned) as 8 uint32 words (2 vector loads)."""
    w0, w1, w2, w3 = _ld4(ptr, m)
    w4, w5, w6, w7 = _ld4(ptr + 8, m)
    return w0, w1, w2, w3, w4, w5, w6, w7


@triton.jit
def _k_half(kp, kp8, d0, mg, m8, e0, e1, e2, e3, f0, f1, f2, f3,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15):  # fmt: skip
    """Scores of rows g (``kp``) and g + 8 (``kp8``) over this lane's 32 dims from ``d0`` (4 words per k-step
    pair), added to the two accumulator chains ``e`` / ``f``."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _ld16(kp + d0, mg)
    a8, a9, a10, a11, a12, a13, a14, a15 = _ld16(kp + d0 + 16, mg)
    b0, b1, b2, b3, b4, b5, b6, b7 = _ld16(kp8 + d0, m8)
    b8, b9, b10, b11, b12, b13, b14, b15 = _ld16(kp8 + d0 + 16, m8)
    e0, e1, e2, e3 = _mma_bf16(a0, b0, a1, b1, q0, q1, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma_bf16(a2, b2, a3, b3, q2, q3, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma_bf16(a4, b4, a5, b5, q4, q5, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma_bf16(a6, b6, a7, b7, q6, q7, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma_bf16(a8, b8, a9, b9, q8, q9, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma_bf16(a10, b10, a11, b11, q10, q11, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma_bf16(a12, b12, a13, b13, q12, q13, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma_bf16(a14, b14, a15, b15, q14, q15, f0, f1, f2, f3)
    return e0, e1, e2, e3, f0, f1, f2, f3


@triton.jit
def _v_half(xp, yp, up, wp, mx, my, mu, mw, pa, pb,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73):  # fmt: skip
    """O^T += V^T P^T of one half: tokens 2t, 2t+1 (x, y) and 2t+8, 2t+9 (u, w), this lane's 16 dims of the
    half (the row pointers already at them); m-tile 2j: dims 4j, 4j + 2 (low halves of words 2j,
    2j + 1), m-tile 2j + 1: dims 4j + 1, 4j + 3."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _ld16(xp, mx)
    y0, y1, y2, y3, y4, y5, y6, y7 = _ld16(yp, my)
    u0, u1, u2, u3, u4, u5, u6, u7 = _ld16(up, mu)
    w0, w1, w2, w3, w4, w5, w6, w7 = _ld16(wp, mw)
    o00, o01, o02, o03 = _mma_bf16(_lo(x0, y0), _lo(x1, y1), _lo(u0, w0), _lo(u1, w1), pa, pb, o00, o01, o02, o03)
    o10, o11, o12, o13 = _mma_bf16(_hi(x0, y0), _hi(x1, y1), _hi(u0, w0), _hi(u1, w1), pa, pb, o10, o11, o12, o13)
    o20, o21, o22, o23 = _mma_bf16(_lo(x2, y2), _lo(x3, y3), _lo(u2, w2), _lo(u3, w3), pa, pb, o20, o21, o22, o23)
    o30, o31, o32, o33 = _mma_bf16(_hi(x2, y2), _hi(x3, y3), _hi(u2, w2), _hi(u3, w3), pa, pb, o30, o31, o32, o33)
    o40, o41, o42, o43 = _mma_bf16(_lo(x4, y4), _lo(x5, y5), _lo(u4, w4), _lo(u5, w5), pa, pb, o40, o41, o42, o43)
    o50, o51, o52, o53 = _mma_bf16(_hi(x4, y4), _hi(x5, y5), _hi(u4, w4), _hi(u5, w5), pa, pb, o50, o51, o52, o53)
    o60, o61, o62, o63 = _mma_bf16(_lo(x6, y6), _lo(x7, y7), _lo(u6, w6), _lo(u7, w7), pa, pb, o60, o61, o62, o63)
    o70, o71, o72, o73 = _mma_bf16(_hi(x6, y6), _hi(x7, y7), _hi(u6, w6), _hi(u7, w7), pa, pb, o70, o71, o72, o73)
    return (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def _q_bf16_frags(qrow, qm):
    """This lane's 32 dims of Q at ``qrow`` as 16 bf16-pair B-fragment registers (zeros past the group)."""
    q0, q1, q2, q3 = _q_bf16(qrow, 0, qm), _q_bf16(qrow, 2, qm), _q_bf16(qrow, 4, qm), _q_bf16(qrow, 6, qm)
    q4, q5, q6, q7 = _q_bf16(qrow, 8, qm), _q_bf16(qrow, 10, qm), _q_bf16(qrow, 12, qm), _q_bf16(qrow, 14, qm)
    q8, q9, q10, q11 = _q_bf16(qrow, 16, qm), _q_bf16(qrow, 18, qm), _q_bf16(qrow, 20, qm), _q_bf16(qrow, 22, qm)
    q12, q13, q14, q15 = _q_bf16(qrow, 24, qm), _q_bf16(qrow, 26, qm), _q_bf16(qrow, 28, qm), _q_bf16(qrow, 30, qm)
    return q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15


@triton.jit
def _tail_setup(tk, tv, h, t_head, lim, part, PARTS: tl.constexpr):
    """KV head ``h``'s K and V bases in the tail pool and rows ``[n0, r1)`` of part ``part`` of ``PARTS`` of a
    ``lim``-row tail: whole 16-row tiles each (the last parts may be empty)."""
    kbase = tk + h.to(tl.int64) * t_head
    vbase = tv + h.to(tl.int64) * t_head
    n0 = lim * 0
    r1 = lim
    if PARTS > 1:
        span = tl.cdiv(tl.cdiv(lim, PARTS), 16) * 16
        n0 = part * span
        r1 = tl.minimum(lim, n0 + span)
    return kbase, vbase, n0, r1


@triton.jit
def _tile_page(tpt_ptr, row, r1, step, pg, TPAGE: tl.constexpr, ONE: tl.constexpr):
    """``ONE`` (a 16-row tile lies in one page): the page id of the tile at row ``row`` (``step`` tokens a row;
    0 from ``r1`` on), loaded a tile ahead so that a tile costs one dependent memory round trip (its rows)
    instead of two; else ``pg``."""
    if ONE:
        pg = tl.load(tpt_ptr + (step * row) // TPAGE, mask=row < r1, other=0).to(tl.int64)
    return pg


@triton.jit
def _mma_tail(q_ptr, s_qh, tk, tv, t_page, t_head, t_tok, tpt_ptr, n, h, qk_scale, o_ptr, lse_ptr, s_oh,
              G: tl.constexpr, D: tl.constexpr, TPAGE: tl.constexpr, VST: tl.constexpr,
              PAIR: tl.constexpr = 0, TPP: tl.constexpr = 0, part=0, PARTS: tl.constexpr = 1):  # fmt: skip
    """One warp attends the ``n`` bf16 tail tokens of KV head ``h`` and stores partial slot 0 at ``o_ptr``.

    ``PARTS > 1``: only part ``part`` of ``PARTS`` (whole 16-row tiles each, the last ones may be empty),
    so that many one-warp programs share a tail (``DecodeConfig.tail_splits``).

    ``TPP`` (where a 16-row tile lies in one page): the next tile's page id is loaded while this tile is
    attended, so a tile costs one dependent memory round trip (its rows) instead of two (page id, rows).

    The fragments of ``_mma_segment`` (head_dim 128, GQA <= 8) with bf16 operands: lane ``t`` owns dims
    ``[32t, 32t + 32)`` of K and Q (k-step ``kk`` = words ``2kk``, ``2kk + 1``: any lane-local dim order
    gives the same dot products), and for V^T the dims ``16g + [0, 2, 1, 3, ...]`` of ``_v_pair``, whose
    token pairs are the low or high bf16 of two tokens' words -- so ``_finish`` stores the result as is.
    ``PAIR`` (head_dim 64, ``_mma_segment``'s two tokens a row): a row is tokens ``2r, 2r + 1`` (adjacent in
    a page of even size), column ``c`` = (head ``c // 2``, parity ``c % 2``); stores slots 0 and 1.
    NOTE: one more program of ``decode_mma_kernel``'s grid instead of its own launch on a side stream: in
    the engine (CUDA graphs, B=1 x 3K) that launch ran beside the main kernel yet cost ~6 us a layer.
    """
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    if PAIR:  # dims [64 p, 64 p + 64) of column g hold head g // 2's Q, p = g % 2 (zeros elsewhere)
        qm = (g // 2 < G) & (t // 2 == g % 2)
        qrow = q_ptr + (h * G + g // 2) * s_qh - 64 * (g % 2) + 32 * t
        lim = (n + 1) // 2  # rows with a first token
        lim1 = n // 2  # rows with both
        step = 2  # tokens a row
    else:
        qm = g < G
        qrow = q_ptr + (h * G + g) * s_qh + 32 * t
        lim = n
        lim1 = n
        step = 1
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15 = _q_bf16_frags(qrow, qm)
    m0, m1, l0, l1, z = _online_init(32)
    o00, o01, o02, o03, o10, o11, o12, o13 = z, z, z, z, z, z, z, z
    o20, o21, o22, o23, o30, o31, o32, o33 = z, z, z, z, z, z, z, z
    o40, o41, o42, o43, o50, o51, o52, o53 = z, z, z, z, z, z, z, z
    o60, o61, o62, o63, o70, o71, o72, o73 = z, z, z, z, z, z, z, z
    kbase, vbase, n0, r1 = _tail_setup(tk, tv, h, t_head, lim, part, PARTS)
    nt = step * lim  # tokens: a row's index bound in _tail_rows
    ONE: tl.constexpr = TPP * (TPAGE % (16 * (1 + PAIR)) == 0)  # NOTE: tiles start at multiples of 16 rows
    pg = _tile_page(tpt_ptr, n0, r1, step, n0.to(tl.int64), TPAGE, ONE)
    while n0 < r1:
        pg_next = _tile_page(tpt_ptr, n0 + 16, r1, step, pg, TPAGE, ONE)  # in flight while this tile is attended
        # S^T = K Q^T: rows g, g + 8 of the tile, this lane's 32 dims
        kp, mg = _tail_rows(kbase, tpt_ptr, step * (n0 + g), nt, t_page, t_tok, TPAGE, pg, ONE)
        kp8, m8 = _tail_rows(kbase, tpt_ptr, step * (n0 + g + 8), nt, t_page, t_tok, TPAGE, pg, ONE)
        # NOTE: PAIR: a row's second token (dims 64-127: lanes t >= 2) may be past the tail (stale bytes)
        mg1 = n0 + g < lim1
        m81 = n0 + g + 8 < lim1
        kmg = mg
        km8 = m8
        if PAIR:
            kmg = mg & ((t < 2) | mg1)
            km8 = m8 & ((t < 2) | m81)
        e0, e1, e2, e3, f0, f1, f2, f3 = _k_half(
            kp, kp8, 32 * t, kmg, km8, z, z, z, z, z, z, z, z,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
        )  # fmt: skip
        s0 = tl.where(mg, e0 + f0, float("-inf"))
        s1 = tl.where(mg1, e1 + f1, float("-inf"))  # PAIR: column 2t+1 has parity 1
        s2 = tl.where(m8, e2 + f2, float("-inf"))
        s3 = tl.where(m81, e3 + f3, float("-inf"))
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_max(
            m0, m1, l0, l1, tl.maximum(s0, s2), tl.maximum(s1, s3), qk_scale, o00, o01, o02, o03, o10, o11,
            o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61,
            o62, o63, o70, o71, o72, o73,
        )  # fmt: skip
        p0, p1 = tl.exp2(s0 * qk_scale - c0), tl.exp2(s1 * qk_scale - c1)
        p2, p3 = tl.exp2(s2 * qk_scale - c0), tl.exp2(s3 * qk_scale - c1)
        l0 = l0 + (p0 + p2)
        l1 = l1 + (p1 + p3)
        pa = _p_frag_bf16(p0, p1)
        pb = _p_frag_bf16(p2, p3)
        # O^T += V^T P^T: tokens 2t, 2t+1 (x, y) and 2t+8, 2t+9 (u, w), dims [16g, 16g + 16) (8 words each)
        xp, mx = _tail_rows(vbase, tpt_ptr, step * (n0 + 2 * t), nt, t_page, t_tok, TPAGE, pg, ONE)
        yp, my = _tail_rows(vbase, tpt_ptr, step * (n0 + 2 * t + 1), nt, t_page, t_tok, TPAGE, pg, ONE)
        up, mu = _tail_rows(vbase, tpt_ptr, step * (n0 + 2 * t + 8), nt, t_page, t_tok, TPAGE, pg, ONE)
        wp, mw = _tail_rows(vbase, tpt_ptr, step * (n0 + 2 * t + 9), nt, t_page, t_tok, TPAGE, pg, ONE)
        if PAIR:  # dims 64-127 (lanes g >= 4) are the row's second token
            mx = mx & ((g < 4) | (n0 + 2 * t < lim1))
            my = my & ((g < 4) | (n0 + 2 * t + 1 < lim1))
            mu = mu & ((g < 4) | (n0 + 2 * t + 8 < lim1))
            mw = mw & ((g < 4) | (n0 + 2 * t + 9 < lim1))
        (
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _v_half(
            xp + 16 * g, yp + 16 * g, up + 16 * g, wp + 16 * g, mx, my, mu, mw, pa, pb,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        )  # fmt: skip
        n0 += 16
        pg = pg_next
    _finish(
        m0, m1, l0, l1, 1.0, o_ptr, lse_ptr, s_oh, g, t, 0, G, D, PAIR, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def decode_tail_kernel(
    q_ptr, s_qb, s_qh, tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr,
    o_ptr, lse_ptr, sm_scale, S_TOT, SLOT,
    HQ: tl.constexpr, G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr, TPAGE: tl.constexpr,
    TBN: tl.constexpr, INTERP: tl.constexpr,
):  # fmt: skip
    """The bf16 tail of each (request, KV head) into partial slot ``SLOT`` of ``S_TOT``; grid ``(B, kv_heads)``.

    NOTE: its own launch, not a program of ``decode_mma_kernel``: a one-warp ``tl.dot`` tail inside that
    kernel made the whole kernel 255 registers with ~1 KB of spills (sm_90) against 128 and
    none without it, halving the warps per SM of every split.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    first = (b.to(tl.int64) * HQ + h * G) * S_TOT + SLOT
    n = tl.load(tlens_ptr + b)
    _tok_segment(
        q_ptr + b.to(tl.int64) * s_qb, s_qh, tk_ptr, tv_ptr, tk_ptr, tv_ptr, t_page, t_head, t_tok, 0, 0, 0,
        tpt_ptr + b.to(tl.int64) * s_tpt, 0, n, h, sm_scale * 1.4426950408889634, 1.0,
        o_ptr + first * D, lse_ptr + first, S_TOT * D,
        G, BH, D, TPAGE, TBN, 0, 0, INTERP,
    )  # fmt: skip
