"""``decode_mma``'s bf16 tail at head_dim 256: ``mma_tail._mma_tail`` (one one-warp program of the grid
attends a request's newest tokens with bf16 ``mma.sync``) on the two 128-dim halves of each row, as
``decode.mma256`` does for the NVFP4 main pool: one score fragment from both halves' K, one softmax, O^T per
half (64 accumulators), stored by ``mma256._finish256``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_step import _rescale
from nibblekv.kernels.decode._mma_tile import _softmax
from nibblekv.kernels.decode.mma256 import _finish256
from nibblekv.kernels.decode.mma_tail import _hi, _ld16, _lo, _q_bf16, _tail_rows
from nibblekv.kernels.ptx.mma import _max8, _mma_bf16, _p_frag_bf16


@triton.jit
def _k_half(kp, kp8, mg, m8, e0, e1, e2, e3, f0, f1, f2, f3,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15):  # fmt: skip
    """Scores of rows g (``kp``) and g + 8 (``kp8``) over this lane's 32 dims of one half (the row pointers
    already at the half), added to the two accumulator chains ``e`` / ``f`` (as ``_mma_tail``)."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _ld16(kp, mg)
    a8, a9, a10, a11, a12, a13, a14, a15 = _ld16(kp + 16, mg)
    b0, b1, b2, b3, b4, b5, b6, b7 = _ld16(kp8, m8)
    b8, b9, b10, b11, b12, b13, b14, b15 = _ld16(kp8 + 16, m8)
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
    half (the row pointers already at them), as ``_mma_tail``."""
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
def _mma_tail256(q_ptr, s_qh, tk, tv, t_page, t_head, t_tok, tpt_ptr, n, h, qk_scale, o_ptr, lse_ptr, s_oh,
                 G: tl.constexpr, TPAGE: tl.constexpr, VST: tl.constexpr, TPP: tl.constexpr = 0, part=0,
                 PARTS: tl.constexpr = 1):  # fmt: skip
    """``_mma_tail`` (no PAIR) at head_dim 256: one warp attends the ``n`` bf16 tail tokens of KV head ``h``
    (part ``part`` of ``PARTS``: whole 16-row tiles each) and stores partial slot 0 at ``o_ptr``; ``TPP``:
    the next tile's page id loads during this tile."""
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    qm = g < G
    qrow = q_ptr + (h * G + g) * s_qh + 32 * t
    q0, q1, q2, q3 = _q_bf16(qrow, 0, qm), _q_bf16(qrow, 2, qm), _q_bf16(qrow, 4, qm), _q_bf16(qrow, 6, qm)
    q4, q5, q6, q7 = _q_bf16(qrow, 8, qm), _q_bf16(qrow, 10, qm), _q_bf16(qrow, 12, qm), _q_bf16(qrow, 14, qm)
    q8, q9, q10, q11 = _q_bf16(qrow, 16, qm), _q_bf16(qrow, 18, qm), _q_bf16(qrow, 20, qm), _q_bf16(qrow, 22, qm)
    q12, q13, q14, q15 = _q_bf16(qrow, 24, qm), _q_bf16(qrow, 26, qm), _q_bf16(qrow, 28, qm), _q_bf16(qrow, 30, qm)
    qh = qrow + 128  # the high half's dims
    r0, r1, r2, r3 = _q_bf16(qh, 0, qm), _q_bf16(qh, 2, qm), _q_bf16(qh, 4, qm), _q_bf16(qh, 6, qm)
    r4, r5, r6, r7 = _q_bf16(qh, 8, qm), _q_bf16(qh, 10, qm), _q_bf16(qh, 12, qm), _q_bf16(qh, 14, qm)
    r8, r9, r10, r11 = _q_bf16(qh, 16, qm), _q_bf16(qh, 18, qm), _q_bf16(qh, 20, qm), _q_bf16(qh, 22, qm)
    r12, r13, r14, r15 = _q_bf16(qh, 24, qm), _q_bf16(qh, 26, qm), _q_bf16(qh, 28, qm), _q_bf16(qh, 30, qm)
    kbase = tk + h.to(tl.int64) * t_head
    vbase = tv + h.to(tl.int64) * t_head
    m0 = tl.full([32], float("-inf"), tl.float32)
    m1 = m0
    z = tl.zeros([32], tl.float32)
    l0, l1 = z, z
    o00, o01, o02, o03, o10, o11, o12, o13 = z, z, z, z, z, z, z, z
    o20, o21, o22, o23, o30, o31, o32, o33 = z, z, z, z, z, z, z, z
    o40, o41, o42, o43, o50, o51, o52, o53 = z, z, z, z, z, z, z, z
    o60, o61, o62, o63, o70, o71, o72, o73 = z, z, z, z, z, z, z, z
    u00, u01, u02, u03, u10, u11, u12, u13 = z, z, z, z, z, z, z, z
    u20, u21, u22, u23, u30, u31, u32, u33 = z, z, z, z, z, z, z, z
    u40, u41, u42, u43, u50, u51, u52, u53 = z, z, z, z, z, z, z, z
    u60, u61, u62, u63, u70, u71, u72, u73 = z, z, z, z, z, z, z, z
    n0 = n * 0
    r_end = n
    if PARTS > 1:  # rows [n0, r_end): this part's whole tiles
        span = tl.cdiv(tl.cdiv(n, PARTS), 16) * 16
        n0 = part * span
        r_end = tl.minimum(n, n0 + span)
    ONE: tl.constexpr = TPP * (TPAGE % 16 == 0)  # NOTE: tiles start at multiples of 16 rows
    pg = n0.to(tl.int64)
    if ONE:
        pg = tl.load(tpt_ptr + n0 // TPAGE, mask=n0 < r_end, other=0).to(tl.int64)
    while n0 < r_end:
        pg_next = pg
        if ONE:  # the next tile's page id, in flight while this tile is attended
            pg_next = tl.load(tpt_ptr + (n0 + 16) // TPAGE, mask=n0 + 16 < r_end, other=0).to(tl.int64)
        # S^T = K_lo Q_lo^T + K_hi Q_hi^T: rows g, g + 8 of the tile, this lane's 32 dims of each half
        kp, mg = _tail_rows(kbase, tpt_ptr, n0 + g, n, t_page, t_tok, TPAGE, pg, ONE)
        kp8, m8 = _tail_rows(kbase, tpt_ptr, n0 + g + 8, n, t_page, t_tok, TPAGE, pg, ONE)
        e0, e1, e2, e3, f0, f1, f2, f3 = _k_half(
            kp + 32 * t, kp8 + 32 * t, mg, m8, z, z, z, z, z, z, z, z,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
        )  # fmt: skip
        e0, e1, e2, e3, f0, f1, f2, f3 = _k_half(
            kp + 128 + 32 * t, kp8 + 128 + 32 * t, mg, m8, e0, e1, e2, e3, f0, f1, f2, f3,
            r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
        )  # fmt: skip
        s0 = tl.where(mg, (e0 + f0) * qk_scale, float("-inf"))
        s1 = tl.where(mg, (e1 + f1) * qk_scale, float("-inf"))
        s2 = tl.where(m8, (e2 + f2) * qk_scale, float("-inf"))
        s3 = tl.where(m8, (e3 + f3) * qk_scale, float("-inf"))
        x0, x1 = _max8(tl.maximum(s0, s2), tl.maximum(s1, s3))
        m0, m1, c0, c1, al0, al1 = _softmax(m0, m1, l0, l1, x0, x1)
        (
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _rescale(
            al0, al1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41,
            o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        )  # fmt: skip
        (
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _rescale(
            al0, al1, u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41,
            u42, u43, u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        )  # fmt: skip
        p0, p1 = tl.exp2(s0 - c0), tl.exp2(s1 - c1)
        p2, p3 = tl.exp2(s2 - c0), tl.exp2(s3 - c1)
        l0 = l0 * al0 + (p0 + p2)
        l1 = l1 * al1 + (p1 + p3)
        pa = _p_frag_bf16(p0, p1)
        pb = _p_frag_bf16(p2, p3)
        # O^T += V^T P^T per half: tokens 2t, 2t+1, 2t+8, 2t+9, dims 128 j + [16g, 16g + 16)
        xp, mx = _tail_rows(vbase, tpt_ptr, n0 + 2 * t, n, t_page, t_tok, TPAGE, pg, ONE)
        yp, my = _tail_rows(vbase, tpt_ptr, n0 + 2 * t + 1, n, t_page, t_tok, TPAGE, pg, ONE)
        up, mu = _tail_rows(vbase, tpt_ptr, n0 + 2 * t + 8, n, t_page, t_tok, TPAGE, pg, ONE)
        wp, mw = _tail_rows(vbase, tpt_ptr, n0 + 2 * t + 9, n, t_page, t_tok, TPAGE, pg, ONE)
        (
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _v_half(
            xp + 16 * g, yp + 16 * g, up + 16 * g, wp + 16 * g, mx, my, mu, mw, pa, pb,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        )  # fmt: skip
        (
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _v_half(
            xp + 128 + 16 * g, yp + 128 + 16 * g, up + 128 + 16 * g, wp + 128 + 16 * g, mx, my, mu, mw, pa, pb,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        )  # fmt: skip
        n0 += 16
        pg = pg_next
    _finish256(
        m0, m1, l0, l1, 1.0, o_ptr, lse_ptr, s_oh, g, t, 0, G, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip
