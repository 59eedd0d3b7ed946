"""``decode_mma`` at head_dim 256 on two warps a split, one 128-dim half each (``DecodeConfig.dim_split``).

Why: one warp holding a whole 256-dim row (``decode.mma256``) needs 211 registers, so only 8 warps share
an SM, and with two warps a scheduler the step's latency shows: the kernel's own instruction stream runs
at ~3 TB/s with every page in L2 against head_dim 128's ~4.4 (H100, ``--page-order l2``), at the same
SASS per byte. Here the two warps of a program attend the same tiles, warp ``w`` dims ``[128 w, 128 w +
128)``: each is the head_dim-128 step of ``decode_mma`` (its Q half, K half, V half, 32 accumulators), so
156 registers and 12 warps an SM. The only coupling is the score: each warp's ``S^T`` is a partial sum
over its half, and the two are added across the warps (``ptx.mma._warp_pair_sum8``: shared memory, one
barrier a step) before the softmax, which both warps then run on the same numbers (same max, sums and
probabilities).

A split writes one partial slot (256 dims: warp ``w`` stores its half; the lse, equal in both, once).
16-row pages, no ``PAIR``, GQA groups <= 8.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_step import (
    _normalizers,
    _pv,
    _scores,
    _step_max,
    _store_frags,
    _store_lse,
)
from nibblekv.kernels.decode._mma_tile import _load_tile, _online_init, _q_frags, _warp_lanes
from nibblekv.kernels.decode.mma256 import _l2_page256, _l2_prefetch256
from nibblekv.kernels.ptx.mma import _p_frag, _warp_pair_sum8


# NOTE: one argument per fragment register, on purpose: see ``_mma_step``'s docstring (why the long signature)
@triton.jit
def _step_x2(
    rawA, rawB, nb, lim, qk_scale, tid, par, m0, m1, l0, l1,
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    MASKED: tl.constexpr, LAZY: tl.constexpr = 0,
):  # fmt: skip
    """``_mma_step._run_step`` (two tiles, ``rawA`` at ``nb``, ``rawB`` at ``nb + 16``) on this warp's half,
    its scores summed with the other warp's before the softmax (masked: tile B is ``rawA`` again, all -inf);
    ``tid`` the program's thread, ``par`` the step's parity (``_warp_pair_sum8``)."""
    sA0, sA1, sA2, sA3 = _scores(
        rawA, nb, lim, lim, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, MASKED,
    )  # fmt: skip
    sB0, sB1, sB2, sB3 = _scores(
        rawB, nb + 16, lim, lim, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, MASKED,
    )  # fmt: skip
    sA0, sA1, sA2, sA3, sB0, sB1, sB2, sB3 = _warp_pair_sum8(sA0, sA1, sA2, sA3, sB0, sB1, sB2, sB3, tid, par)
    mx0 = tl.maximum(tl.maximum(sA0, sA2), tl.maximum(sB0, sB2))
    mx1 = tl.maximum(tl.maximum(sA1, sA3), tl.maximum(sB1, sB3))
    (
        m0, m1, c0, c1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    ) = _step_max(
        m0, m1, l0, l1, mx0, mx1, qk_scale, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30,
        o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73, LAZY,
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
    return (
        m0, m1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def _mma256x2_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
    pt_ptr, start, end, h, qk_scale, out_scale, o_ptr, lse_ptr, s_oh,
    G: tl.constexpr, PAGE: tl.constexpr, PF: tl.constexpr, VST: tl.constexpr = 0, VQ: tl.constexpr = 0,
    L2: tl.constexpr = 0, LZ: tl.constexpr = 0,
):  # fmt: skip
    """Both warps attend the 16-token tiles of ``[start, end)``, two a step (``PF``: the next step's bytes
    load during this one), warp ``w`` dims ``[128 w, 128 w + 128)``, and store one partial (o at ``o_ptr``,
    256 dims; lse at ``lse_ptr``; ``s_oh`` = elements between two heads' partials). ``L2`` (16-row pages):
    warp ``w`` prefetches tile ``w`` of the step ``L2`` steps ahead into L2 (``mma256._l2_prefetch256``, both
    halves). ``LZ``: the lazy softmax (``_mma_step._step_max``), both warps alike (the same scores)."""
    lane, warp, g, t, k64, v64, ks16, vs8, hoff, shoff = _warp_lanes(
        k_ptr, v_ptr, ks_ptr, vs_ptr, h, s_head, sc_head, 2,
    )  # fmt: skip
    # NOTE: at D = 256 _load_tile takes a row's first 64 data / 8 scale bytes from the head offset: the
    # warp's half is 64 w / 8 w bytes further (mma256's _load_halves)
    hoff2, shoff2 = hoff, shoff  # the whole row's, for the L2 prefetch
    hoff = hoff + 64 * warp
    shoff = shoff + 8 * warp
    qm = g < G
    qrow = q_ptr + (h * G + g) * s_qh + 128 * warp
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15 = _q_frags(qrow + 32 * t, qm, VQ)
    m0, m1, l0, l1, z = _online_init(64)
    o00, o01, o02, o03, o10, o11, o12, o13 = z, z, z, z, z, z, z, z
    o20, o21, o22, o23, o30, o31, o32, o33 = z, z, z, z, z, z, z, z
    o40, o41, o42, o43, o50, o51, o52, o53 = z, z, z, z, z, z, z, z
    o60, o61, o62, o63, o70, o71, o72, o73 = z, z, z, z, z, z, z, z
    full_end = start + (end - start) // 32 * 32
    if L2 > 0 and PAGE == 16:  # the first L2 prefetch's page
        pl = _l2_page256(pt_ptr, start, L2 * 32, full_end, warp, PAGE)
    if PF:
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, start, full_end, full_end, hoff, shoff, s_page, sc_page, g, t, PAGE,
            256, True,
        )  # fmt: skip
        rawB = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, start + 16, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
            PAGE, 256, True,
        )  # fmt: skip
    n0 = start
    while n0 < full_end:  # NOTE: `while`, not `for` (triton 3.6's interpreter: no `for` over loaded bounds)
        if L2 > 0 and PAGE == 16:  # NOTE: pl holds the page of step n0 + L2 * 32 (loaded last step)
            _l2_prefetch256(k64, v64, ks16, vs8, pl, hoff2, shoff2, s_page, sc_page, lane)
            pl = _l2_page256(pt_ptr, n0, (L2 + 1) * 32, full_end, warp, PAGE)
        if PF:  # the next step (the current one again on the last step: no mask needed)
            nxt = tl.where(n0 + 32 < full_end, n0 + 32, n0)
            nextA = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nxt, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, 256, False,
            )  # fmt: skip
            nextB = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nxt + 16, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, 256, False,
            )  # fmt: skip
        else:
            rawA = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, n0, full_end, full_end, hoff, shoff, s_page, sc_page, g, t, PAGE,
                256, False,
            )  # fmt: skip
            rawB = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, n0 + 16, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, 256, False,
            )  # fmt: skip
        (
            m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_x2(
            rawA, rawB, n0, full_end, qk_scale, lane, lane * 0 + (n0 // 32) % 2, m0, m1, l0, l1, q0, q1, q2,
            q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, o00, o01, o02, o03, o10, o11, o12,
            o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61,
            o62, o63, o70, o71, o72, o73, False, LZ,
        )  # fmt: skip
        if PF:
            rawA = nextA
            rawB = nextB
        n0 += 32
    # the rest (< 32 tokens): one masked tile a step (the second tile is the first again, masked off whole)
    while n0 < end:
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, n0, end, end, hoff, shoff, s_page, sc_page, g, t, PAGE, 256, True,
        )  # fmt: skip
        (
            m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_x2(
            rawA, rawA, n0, tl.minimum(end, n0 + 16), qk_scale, lane, lane * 0 + (n0 // 16) % 2, m0, m1, l0,
            l1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, o00, o01, o02, o03,
            o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52,
            o53, o60, o61, o62, o63, o70, o71, o72, o73, True, LZ,
        )  # fmt: skip
        n0 += 16
    l0, l1, i0, i1 = _normalizers(l0, l1, out_scale)
    hm0 = 2 * t < G
    hm1 = 2 * t + 1 < G
    _store_frags(
        o_ptr + (2 * t) * s_oh + 128 * warp, g, s_oh, hm0, hm1, i0, i1, 0, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip
    # NOTE: both warps hold the same lse (the same scores): each stores it, to the same place
    _store_lse(m0, m1, l0, l1, lse_ptr, s_oh, g, t, 0, G, 256, 0)
