"""One 16-token step of ``decode_mma``'s main-pool loop and its epilogue, on PTX fragment registers.

``_scores`` (S^T = K Q^T of one tile), ``_pv`` (O^T += V^T P^T), ``_rescale`` / ``_advance`` / ``_step_max``
(the online softmax), ``_run_step`` (one step on a converted tile pair) and the
stores of a warp's partial (``_store_*``, ``_finish``). Used by ``decode_mma._mma_segment`` (so by the
token-balanced kernel too) and the bf16 tail (``decode_mma_tail``); the fragment layout is in ``decode_mma``.

Why the long signatures (``_run_step`` takes ~60 arguments): each PTX fragment is a ``[32 * NW]`` tensor
that must stay in registers, one per lane. Triton has no register arrays, and a 2-D tensor or a tuple of
tensors would get another layout (shared-memory or local-memory traffic), so every fragment travels as its
own scalar argument and return value.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_tile import _softmax, _tile_regs
from nibblekv.kernels.ptx.mma import _lane_reduce, _mma, _p_frag, _st4


@triton.jit
def _scores(raw, n0, lim, lim1,
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            MASKED: tl.constexpr):  # fmt: skip
    """S^T fragment of one tile, not yet times the softmax scale: (token g, head 2t), (g, 2t+1), (g+8, 2t),
    (g+8, 2t+1).

    Masked (MASKED: token >= lim; columns 2t+1 token >= lim1, see PAIR in ``_mma_segment``) scores are
    -inf. ``n0`` is this warp's tile start.

    NOTE: the scale (> 0) goes on after the step's column max (``_step_max``) and into the exponent's FFMA
    (``exp2(s * scale - c)``): scaling each score first cost 4 FMUL a tile that fed only the max.
    """
    (
        kg0, kg1, kg2, kg3, kg4, kg5, kg6, kg7, kg8, kg9, kg10, kg11, kg12, kg13, kg14, kg15,
        k80, k81, k82, k83, k84, k85, k86, k87, k88, k89, k810, k811, k812, k813, k814, k815,
    ) = _tile_regs(raw, 0)  # fmt: skip
    z = tl.zeros(q0.shape, tl.float32)
    e0, e1, e2, e3 = z, z, z, z
    f0, f1, f2, f3 = z, z, z, z
    e0, e1, e2, e3 = _mma(kg0, k80, kg1, k81, q0, q1, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(kg2, k82, kg3, k83, q2, q3, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(kg4, k84, kg5, k85, q4, q5, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(kg6, k86, kg7, k87, q6, q7, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(kg8, k88, kg9, k89, q8, q9, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(kg10, k810, kg11, k811, q10, q11, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(kg12, k812, kg13, k813, q12, q13, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(kg14, k814, kg15, k815, q14, q15, f0, f1, f2, f3)
    s0 = e0 + f0
    s1 = e1 + f1
    s2 = e2 + f2
    s3 = e3 + f3
    if MASKED:
        g = (tl.arange(0, s0.shape[0]) % 32) // 4
        s0 = tl.where(n0 + g < lim, s0, float("-inf"))
        s1 = tl.where(n0 + g < lim1, s1, float("-inf"))
        s2 = tl.where(n0 + g + 8 < lim, s2, float("-inf"))
        s3 = tl.where(n0 + g + 8 < lim1, s3, float("-inf"))
    return s0, s1, s2, s3


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _pv(raw, pa, pb,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ):  # fmt: skip
    """O^T += V^T P^T for one tile (``pa``/``pb``: P^T fragments of tokens 2t, 2t+1 / 2t+8, 2t+9)."""
    (
        va0, va1, va2, va3, va4, va5, va6, va7, va8, va9, va10, va11, va12, va13, va14, va15,
        vb0, vb1, vb2, vb3, vb4, vb5, vb6, vb7, vb8, vb9, vb10, vb11, vb12, vb13, vb14, vb15,
    ) = _tile_regs(raw, 1)  # fmt: skip
    o00, o01, o02, o03 = _mma(va0, va1, vb0, vb1, pa, pb, o00, o01, o02, o03)
    o10, o11, o12, o13 = _mma(va2, va3, vb2, vb3, pa, pb, o10, o11, o12, o13)
    o20, o21, o22, o23 = _mma(va4, va5, vb4, vb5, pa, pb, o20, o21, o22, o23)
    o30, o31, o32, o33 = _mma(va6, va7, vb6, vb7, pa, pb, o30, o31, o32, o33)
    o40, o41, o42, o43 = _mma(va8, va9, vb8, vb9, pa, pb, o40, o41, o42, o43)
    o50, o51, o52, o53 = _mma(va10, va11, vb10, vb11, pa, pb, o50, o51, o52, o53)
    o60, o61, o62, o63 = _mma(va12, va13, vb12, vb13, pa, pb, o60, o61, o62, o63)
    o70, o71, o72, o73 = _mma(va14, va15, vb14, vb15, pa, pb, o70, o71, o72, o73)
    return (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _rescale(al0, al1,
             o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42,
             o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
             ):  # fmt: skip
    """O^T columns of heads 2t (``al0``) and 2t+1 (``al1``) times the softmax correction."""
    o00, o01, o02, o03 = o00 * al0, o01 * al1, o02 * al0, o03 * al1
    o10, o11, o12, o13 = o10 * al0, o11 * al1, o12 * al0, o13 * al1
    o20, o21, o22, o23 = o20 * al0, o21 * al1, o22 * al0, o23 * al1
    o30, o31, o32, o33 = o30 * al0, o31 * al1, o32 * al0, o33 * al1
    o40, o41, o42, o43 = o40 * al0, o41 * al1, o42 * al0, o43 * al1
    o50, o51, o52, o53 = o50 * al0, o51 * al1, o52 * al0, o53 * al1
    o60, o61, o62, o63 = o60 * al0, o61 * al1, o62 * al0, o63 * al1
    o70, o71, o72, o73 = o70 * al0, o71 * al1, o72 * al0, o73 * al1
    return (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _advance(
    m0, m1, l0, l1, x0, x1,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
):  # fmt: skip
    """The online softmax's step to a new column max ``x0/x1``: (m0, m1, c0, c1, l0, l1, O^T), with the sums
    and O^T rescaled to the new max and ``c`` the max the step's scores subtract (see ``_softmax``)."""
    m0, m1, c0, c1, al0, al1 = _softmax(m0, m1, l0, l1, x0, x1)
    (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    ) = _rescale(
        al0, al1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41,
        o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip
    return (
        m0, m1, c0, c1, l0 * al0, l1 * al1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def _grows(m0, m1, x0, x1, LAZY: tl.constexpr):
    """Whether any lane's column max ``x0/x1`` exceeds its running max by more than ``LAZY`` (log2 units):
    the lazy softmax's advance test. NOTE: a scalar for the whole program (one warp in every mma launch),
    so the branch it takes is warp-uniform; a running max of -inf always grows on a finite score."""
    grow = (x0 > m0 + LAZY) | (x1 > m1 + LAZY)
    return tl.max(grow.to(tl.int32), axis=0) > 0


@triton.jit
def _kept_max(m0, m1):
    """The max a step's scores subtract when the running max stays (``_softmax``'s ``c`` for it): the
    scores then sit at most ``LAZY`` above it, so each probability is <= 2**LAZY (fp16 holds it)."""
    c0 = tl.where(m0 > float("-inf"), m0, 0.0)
    c1 = tl.where(m1 > float("-inf"), m1, 0.0)
    return c0, c1


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _step_max(
    m0, m1, l0, l1, mx0, mx1, scale,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    LAZY: tl.constexpr = 0,
):  # fmt: skip
    """``_advance`` to the column max of this lane's step maxima ``mx0/mx1`` (the shuffles included) times
    ``scale`` (> 0: the max of the scaled scores). ``LAZY`` > 0: only where some column's max grew by more
    than ``LAZY`` (log2 units) since the last advance (``_grows``), else the old max stays."""
    x0, x1 = _lane_reduce(mx0, mx1, True, True)
    x0, x1 = x0 * scale, x1 * scale
    grow = True
    if LAZY > 0:  # NOTE: a constexpr test; without LAZY ``grow`` stays the constant True (no branch)
        grow = _grows(m0, m1, x0, x1, LAZY)
    if grow:
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42,
            o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _advance(
            m0, m1, l0, l1, x0, x1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31,
            o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        )  # fmt: skip
    else:
        c0, c1 = _kept_max(m0, m1)
    return (
        m0, m1, c0, c1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _run_step(
    rawA, rawB, nb, lim, lim1, qk_scale, m0, m1, l0, l1,
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    TPI: tl.constexpr, MASKED: tl.constexpr, LAZY: tl.constexpr = 0,
):  # fmt: skip
    """One softmax step over ``TPI`` tiles (``rawA``, ``rawB``) of this warp at ``nb``; returns the new
    (m0, m1, l0, l1, O^T fragments). ``LAZY``: ``_step_max``'s."""
    if TPI == 2:
        sA0, sA1, sA2, sA3 = _scores(
            rawA, nb + 0, lim, lim1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, MASKED,
        )  # fmt: skip
        sB0, sB1, sB2, sB3 = _scores(
            rawB, nb + 16, lim, lim1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, MASKED,
        )  # fmt: skip
        mx0 = tl.maximum(tl.maximum(sA0, sA2), tl.maximum(sB0, sB2))
        mx1 = tl.maximum(tl.maximum(sA1, sA3), tl.maximum(sB1, sB3))
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_max(
            m0, m1, l0, l1, mx0, mx1, qk_scale, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30,
            o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            LAZY,
        )  # fmt: skip
        pA0, pA1 = tl.exp2(sA0 * qk_scale - c0), tl.exp2(sA1 * qk_scale - c1)
        pA2, pA3 = tl.exp2(sA2 * qk_scale - c0), tl.exp2(sA3 * qk_scale - c1)
        pB0, pB1 = tl.exp2(sB0 * qk_scale - c0), tl.exp2(sB1 * qk_scale - c1)
        pB2, pB3 = tl.exp2(sB2 * qk_scale - c0), tl.exp2(sB3 * qk_scale - c1)
        l0 = l0 + (pA0 + pA2 + pB0 + pB2)
        l1 = l1 + (pA1 + pA3 + pB1 + pB3)
        (
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _pv(
            rawA, _p_frag(pA0, pA1), _p_frag(pA2, pA3), o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22,
            o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72,
            o73,
        )  # fmt: skip
        (
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _pv(
            rawB, _p_frag(pB0, pB1), _p_frag(pB2, pB3), o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22,
            o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72,
            o73,
        )  # fmt: skip
    else:
        sA0, sA1, sA2, sA3 = _scores(
            rawA, nb + 0, lim, lim1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, MASKED,
        )  # fmt: skip
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_max(
            m0, m1, l0, l1, tl.maximum(sA0, sA2), tl.maximum(sA1, sA3), qk_scale, o00, o01, o02, o03, o10, o11,
            o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61,
            o62, o63, o70, o71, o72, o73, LAZY,
        )  # fmt: skip
        pA0, pA1 = tl.exp2(sA0 * qk_scale - c0), tl.exp2(sA1 * qk_scale - c1)
        pA2, pA3 = tl.exp2(sA2 * qk_scale - c0), tl.exp2(sA3 * qk_scale - c1)
        l0 = l0 + (pA0 + pA2)
        l1 = l1 + (pA1 + pA3)
        (
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _pv(
            rawA, _p_frag(pA0, pA1), _p_frag(pA2, pA3), o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22,
            o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72,
            o73,
        )  # fmt: skip
    return (
        m0, m1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def _store_pair(ptr, a, b, c, d, s_oh, hm0, hm1):
    """O^T fragment -> partial output: (head 2t, dim), (2t+1, dim), (2t, dim + 2), (2t+1, dim + 2)."""
    tl.store(ptr, a, mask=hm0)
    tl.store(ptr + s_oh, b, mask=hm1)
    tl.store(ptr + 2, c, mask=hm0)
    tl.store(ptr + s_oh + 2, d, mask=hm1)


@triton.jit
def _store_all(obase, g, s_col, hm0, hm1,
               a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33,
               a40, a41, a42, a43, a50, a51, a52, a53, a60, a61, a62, a63, a70, a71, a72, a73):  # fmt: skip
    """The O^T fragments (already normalized) as scalar stores: dims ``16 g + {0, 1, 4, 5, 8, 9, 12, 13}`` (+2)."""
    _store_pair(obase + (16 * g + 0), a00, a01, a02, a03, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 1), a10, a11, a12, a13, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 4), a20, a21, a22, a23, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 5), a30, a31, a32, a33, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 8), a40, a41, a42, a43, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 9), a50, a51, a52, a53, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 12), a60, a61, a62, a63, s_col, hm0, hm1)
    _store_pair(obase + (16 * g + 13), a70, a71, a72, a73, s_col, hm0, hm1)


@triton.jit
def _store_rows(ptr, s_col, hm0, hm1, PAIR: tl.constexpr,
                e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15,
                f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15):  # fmt: skip
    """16 consecutive dims at ``ptr`` of the even column (``e``) and, ``s_col`` further, the odd one (``f``),
    as 4 + 4 vector stores. ``PAIR``: one row per lane -- the even column where ``hm0``, else the odd one."""
    if PAIR:
        e0, e1, e2, e3 = tl.where(hm0, e0, f0), tl.where(hm0, e1, f1), tl.where(hm0, e2, f2), tl.where(hm0, e3, f3)
        e4, e5, e6, e7 = tl.where(hm0, e4, f4), tl.where(hm0, e5, f5), tl.where(hm0, e6, f6), tl.where(hm0, e7, f7)
        e8, e9, e10, e11 = tl.where(hm0, e8, f8), tl.where(hm0, e9, f9), tl.where(hm0, e10, f10), tl.where(hm0, e11, f11)
        e12, e13 = tl.where(hm0, e12, f12), tl.where(hm0, e13, f13)
        e14, e15 = tl.where(hm0, e14, f14), tl.where(hm0, e15, f15)
        m = hm0 | hm1
        _st4(ptr, e0, e1, e2, e3, m)
        _st4(ptr + 4, e4, e5, e6, e7, m)
        _st4(ptr + 8, e8, e9, e10, e11, m)
        _st4(ptr + 12, e12, e13, e14, e15, m)
    else:
        _st4(ptr, e0, e1, e2, e3, hm0)
        _st4(ptr + 4, e4, e5, e6, e7, hm0)
        _st4(ptr + 8, e8, e9, e10, e11, hm0)
        _st4(ptr + 12, e12, e13, e14, e15, hm0)
        _st4(ptr + s_col, f0, f1, f2, f3, hm1)
        _st4(ptr + s_col + 4, f4, f5, f6, f7, hm1)
        _st4(ptr + s_col + 8, f8, f9, f10, f11, hm1)
        _st4(ptr + s_col + 12, f12, f13, f14, f15, hm1)


@triton.jit
def _normalizers(l0, l1, out_scale):
    """A warp's softmax sums over its 8 row groups and the factors that normalize its O^T columns."""
    l0, l1 = _lane_reduce(l0, l1, False, True)
    # An empty warp stores lse = -inf and o = 0, which the combine step weighs as nothing.
    i0 = tl.where(l0 > 0, out_scale / tl.maximum(l0, 1e-30), 0.0)
    i1 = tl.where(l1 > 0, out_scale / tl.maximum(l1, 1e-30), 0.0)
    return l0, l1, i0, i1


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _store_frags(
    obase, g, s_col, hm0, hm1, i0, i1, PAIR: tl.constexpr, VST: tl.constexpr,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
):  # fmt: skip
    """O^T fragments times ``i0`` (column 2t) / ``i1`` (2t+1), stored as 128 dims at ``obase`` (``_finish``)."""
    if VST:  # NOTE: lane (g, t) holds dims [16 g, 16 g + 16) of both its columns: 16-byte vector stores
        _store_rows(obase + 16 * g, s_col, hm0, hm1, PAIR,
                    o00 * i0, o10 * i0, o02 * i0, o12 * i0, o20 * i0, o30 * i0, o22 * i0, o32 * i0,
                    o40 * i0, o50 * i0, o42 * i0, o52 * i0, o60 * i0, o70 * i0, o62 * i0, o72 * i0,
                    o01 * i1, o11 * i1, o03 * i1, o13 * i1, o21 * i1, o31 * i1, o23 * i1, o33 * i1,
                    o41 * i1, o51 * i1, o43 * i1, o53 * i1, o61 * i1, o71 * i1, o63 * i1, o73 * i1)  # fmt: skip
    else:
        _store_all(obase, g, s_col, hm0, hm1,
                   o00 * i0, o01 * i1, o02 * i0, o03 * i1, o10 * i0, o11 * i1, o12 * i0, o13 * i1,
                   o20 * i0, o21 * i1, o22 * i0, o23 * i1, o30 * i0, o31 * i1, o32 * i0, o33 * i1,
                   o40 * i0, o41 * i1, o42 * i0, o43 * i1, o50 * i0, o51 * i1, o52 * i0, o53 * i1,
                   o60 * i0, o61 * i1, o62 * i0, o63 * i1, o70 * i0, o71 * i1, o72 * i0, o73 * i1)  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _finish(
    m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp,
    G: tl.constexpr, D: tl.constexpr, PAIR: tl.constexpr, VST: tl.constexpr,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
):  # fmt: skip
    """A warp's epilogue: normalize its O^T fragments and store them and the lse as partial slot ``warp``
    (``_mma_segment``'s ``o_ptr`` / ``lse_ptr`` / ``s_oh``)."""
    l0, l1, i0, i1 = _normalizers(l0, l1, out_scale)
    if PAIR:  # columns 2t / 2t+1 = head t, parity 0 / 1: dims [0, 64) of slot 2w / [64, 128) of slot 2w+1
        DO: tl.constexpr = D // 2
        hm0 = (t < G) & (g < 4)
        hm1 = (t < G) & (g >= 4)
        obase = o_ptr + t * s_oh + (2 * warp) * DO  # NOTE: both parities land at + 16 g + j (see above)
        s_col = 0
    else:
        DO: tl.constexpr = D
        hm0 = 2 * t < G
        hm1 = 2 * t + 1 < G
        obase = o_ptr + (2 * t) * s_oh + warp * D
        s_col = s_oh
    _store_frags(
        obase, g, s_col, hm0, hm1, i0, i1, PAIR, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip
    _store_lse(m0, m1, l0, l1, lse_ptr, s_oh, g, t, warp, G, D, PAIR)


@triton.jit
def _store_lse(m0, m1, l0, l1, lse_ptr, s_oh, g, t, warp, G: tl.constexpr, D: tl.constexpr, PAIR: tl.constexpr):
    """A warp's lse of both its columns (``-inf`` where empty) as partial slot ``warp`` (``_finish``)."""
    lse0 = tl.where(l0 > 0, m0 + tl.log2(tl.maximum(l0, 1e-30)), float("-inf"))
    lse1 = tl.where(l1 > 0, m1 + tl.log2(tl.maximum(l1, 1e-30)), float("-inf"))
    if PAIR:
        lbase = lse_ptr + t * (s_oh // (D // 2)) + 2 * warp
        tl.store(lbase, lse0, mask=(t < G) & (g == 0))
        tl.store(lbase + 1, lse1, mask=(t < G) & (g == 0))
    else:
        lbase = lse_ptr + (2 * t) * (s_oh // D) + warp
        tl.store(lbase, lse0, mask=(2 * t < G) & (g == 0))
        tl.store(lbase + s_oh // D, lse1, mask=(2 * t + 1 < G) & (g == 0))
