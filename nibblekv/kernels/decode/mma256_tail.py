"""``decode_mma``'s bf16 tail at head_dim 256: ``mma_tail._mma_tail`` on the two 128-dim halves of each row,
with ``decode.mma256``'s softmax step (``_fold256``: one score fragment from both halves' K) and epilogue
(``_finish256``)."""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_tile import _online_init
from nibblekv.kernels.decode.mma256 import _finish256, _fold256
from nibblekv.kernels.decode.mma_tail import (
    _k_half,
    _q_bf16_frags,
    _tail_rows,
    _tail_setup,
    _tile_page,
    _v_half,
)
from nibblekv.kernels.ptx.mma import _p_frag_bf16


# NOTE: one argument per fragment register, on purpose: see ``_mma_step``'s docstring (why the long signature)
@triton.jit
def _v_both(
    xp, yp, up, wp, mx, my, mu, mw, pa, pb,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43, u50,
    u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
):  # fmt: skip
    """The bf16 tail's O^T += V^T P^T (``mma_tail._v_half``) on both halves: dims ``[0, 128)`` into ``o``,
    ``[128, 256)`` into ``u`` (the row pointers at this lane's dims of the low half)."""
    (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    ) = _v_half(
        xp, yp, up, wp, mx, my, mu, mw, pa, pb,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip
    (
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    ) = _v_half(
        xp + 128, yp + 128, up + 128, wp + 128, mx, my, mu, mw, pa, pb,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip
    return (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip


@triton.jit
def _mma_tail256(q_ptr, s_qh, tk, tv, t_page, t_head, t_tok, tpt_ptr, n, h, qk_scale, o_ptr, lse_ptr, s_oh,
                 G: tl.constexpr, TPAGE: tl.constexpr, VST: tl.constexpr, TPP: tl.constexpr = 0, part=0,
                 PARTS: tl.constexpr = 1):  # fmt: skip
    """``mma_tail._mma_tail`` (no PAIR) at head_dim 256, on the two halves as ``_mma256_segment`` (one score
    fragment from both halves' K, ``_fold256``, O^T per half, ``_finish256``): one warp attends the ``n`` bf16
    tail tokens of KV head ``h`` (part ``part`` of ``PARTS``: whole 16-row tiles each) and stores partial
    slot 0 at ``o_ptr``; ``TPP``: the next tile's page id loads during this tile."""
    lane = tl.arange(0, 32)
    g = lane // 4
    t = lane % 4
    qm = g < G
    qrow = q_ptr + (h * G + g) * s_qh + 32 * t
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15 = _q_bf16_frags(qrow, qm)
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15 = _q_bf16_frags(qrow + 128, qm)
    m0, m1, l0, l1, z = _online_init(32)
    o00, o01, o02, o03, o10, o11, o12, o13 = z, z, z, z, z, z, z, z
    o20, o21, o22, o23, o30, o31, o32, o33 = z, z, z, z, z, z, z, z
    o40, o41, o42, o43, o50, o51, o52, o53 = z, z, z, z, z, z, z, z
    o60, o61, o62, o63, o70, o71, o72, o73 = z, z, z, z, z, z, z, z
    u00, u01, u02, u03, u10, u11, u12, u13 = z, z, z, z, z, z, z, z
    u20, u21, u22, u23, u30, u31, u32, u33 = z, z, z, z, z, z, z, z
    u40, u41, u42, u43, u50, u51, u52, u53 = z, z, z, z, z, z, z, z
    u60, u61, u62, u63, u70, u71, u72, u73 = z, z, z, z, z, z, z, z
    kbase, vbase, n0, r_end = _tail_setup(tk, tv, h, t_head, n, part, PARTS)
    ONE: tl.constexpr = TPP * (TPAGE % 16 == 0)  # NOTE: tiles start at multiples of 16 rows
    pg = _tile_page(tpt_ptr, n0, r_end, 1, n0.to(tl.int64), TPAGE, ONE)
    while n0 < r_end:
        pg_next = _tile_page(tpt_ptr, n0 + 16, r_end, 1, pg, TPAGE, ONE)
        # S^T = K_lo Q_lo^T + K_hi Q_hi^T: rows g, g + 8 of the tile, this lane's 32 dims of each half
        kp, mg = _tail_rows(kbase, tpt_ptr, n0 + g, n, t_page, t_tok, TPAGE, pg, ONE)
        kp8, m8 = _tail_rows(kbase, tpt_ptr, n0 + g + 8, n, t_page, t_tok, TPAGE, pg, ONE)
        e0, e1, e2, e3, f0, f1, f2, f3 = _k_half(
            kp, kp8, 32 * t, mg, m8, z, z, z, z, z, z, z, z,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
        )  # fmt: skip
        e0, e1, e2, e3, f0, f1, f2, f3 = _k_half(
            kp, kp8, 128 + 32 * t, mg, m8, e0, e1, e2, e3, f0, f1, f2, f3,
            r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
        )  # fmt: skip
        s0 = tl.where(mg, e0 + f0, float("-inf"))
        s1 = tl.where(mg, e1 + f1, float("-inf"))
        s2 = tl.where(m8, e2 + f2, float("-inf"))
        s3 = tl.where(m8, e3 + f3, float("-inf"))
        (
            m0, m1, l0, l1, p0, p1, p2, p3,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _fold256(
            s0, s1, s2, s3, qk_scale, m0, m1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        )  # fmt: skip
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
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _v_both(
            xp + 16 * g, yp + 16 * g, up + 16 * g, wp + 16 * g, mx, my, mu, mw, pa, pb,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
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
