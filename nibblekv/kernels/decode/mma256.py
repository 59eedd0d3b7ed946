"""``decode_mma`` at head_dim 256: the head_dim-128 step on the two 128-dim halves of each row.

A 256-dim NVFP4 row is 128 data bytes and 16 scale bytes; its low half (dims ``[0, 128)``) is bytes
``[0, 64)`` and scales ``[0, 8)``, its high half the rest. ``_load_tile`` at ``D = 256`` takes rows 128
bytes apart and, from a head offset, the same lane bytes as at head_dim 128: at the head's offset the low
half, 64 (8) bytes further the high one. So each tile is two ``_load_tile`` results in the head_dim-128
fragment layout (``decode_mma``'s docstring), and:

* ``S^T = K_lo Q_lo^T + K_hi Q_hi^T``: two ``_scores`` (the high half unmasked -- its masked rows read
  zeros and add 0 to the low half's -inf), one score fragment, one online softmax step.
* ``O^T = V^T P^T`` per half from the same ``P^T`` fragments: 32 accumulators each (64 in all), both
  rescaled by the same correction.

Q is 32 fragment registers (16 a half). One 16-token tile a step (``TPI`` = 1): with the next step
prefetched (``PF``) a warp holds two tiles' raw words (2 x 2 x 20 registers) beside 64 accumulators and
32 Q registers, which needs the 248-register budget of 8 one-warp programs per SM
(``decode.knobs.mma_knobs``). GQA groups <= 8, no ``PAIR``. ``L2`` (opt-in, as ``decode_mma16``'s): an
L2 prefetch of the tile ``L2`` steps ahead, one 128-byte line a lane (``_l2_prefetch256``).

The bf16 tail at head_dim 256 (``decode.mma256_tail``) shares the softmax step (``_fold256``) and the
epilogue (``_finish256``) with the NVFP4 segment.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_ring import (
    _STAGE,
    _ring_close,
    _ring_next,
    _ring_start,
    _ring_tile,
    _run_addr,
)
from nibblekv.kernels.decode._mma_step import (
    _advance,
    _grows,
    _kept_max,
    _normalizers,
    _pv,
    _scores,
    _store_frags,
    _store_lse,
)
from nibblekv.kernels.decode._mma_tile import (
    _load_tile,
    _online_init,
    _q_frags,
    _warp_lanes,
)
from nibblekv.kernels.ptx.mma import _lane_reduce, _p_frag, _page_addr, _prefetch_l2, _prefetch_l2_bulk
from nibblekv.kernels.ptx.ring import _ring_src


# NOTE: one argument per fragment register, on purpose: see ``_mma_step``'s docstring (why the long signature)
@triton.jit
def _fold256(
    s0, s1, s2, s3, scale, m0, m1, l0, l1,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43, u50,
    u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    LAZY: tl.constexpr = 0,
):  # fmt: skip
    """The online softmax step on one score fragment ``s`` of both halves (the NVFP4 step and the bf16 tail),
    whose scores are ``s * scale`` (``scale`` > 0; see ``_mma_step._scores``): returns the new (m0, m1, l0,
    l1), the probabilities ``p0..p3`` and the O^T halves ``o`` / ``u`` rescaled to the new max. ``LAZY``:
    ``_mma_step._step_max``'s (the max and both halves advance only where some column grew by more)."""
    x0, x1 = _lane_reduce(tl.maximum(s0, s2), tl.maximum(s1, s3), True, True)
    x0, x1 = x0 * scale, x1 * scale
    grow = True
    if LAZY > 0:  # NOTE: a constexpr test; without LAZY ``grow`` stays the constant True (no branch)
        grow = _grows(m0, m1, x0, x1, LAZY)
    if grow:
        (
            n0, n1, c0, c1, k0, k1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42,
            o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _advance(
            m0, m1, l0, l1, x0, x1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32,
            o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        )  # fmt: skip
        # NOTE: the u half's step computes the same max and correction again: one copy after common
        # subexpressions
        (
            n0, n1, c0, c1, k0, k1,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42,
            u43, u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _advance(
            m0, m1, l0, l1, x0, x1, u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32,
            u33, u40, u41, u42, u43, u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        )  # fmt: skip
    else:
        n0, n1, k0, k1 = m0, m1, l0, l1
        c0, c1 = _kept_max(m0, m1)
    p0, p1 = tl.exp2(s0 * scale - c0), tl.exp2(s1 * scale - c1)
    p2, p3 = tl.exp2(s2 * scale - c0), tl.exp2(s3 * scale - c1)
    return (
        n0, n1, k0 + (p0 + p2), k1 + (p1 + p3), p0, p1, p2, p3,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see ``_mma_step``'s docstring (why the long signature)
@triton.jit
def _step256(
    rawL, rawH, nb, lim, qk_scale, m0, m1, l0, l1,
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43, u50,
    u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    MASKED: tl.constexpr, LAZY: tl.constexpr = 0,
):  # fmt: skip
    """One softmax step over this warp's tile at ``nb`` (low half ``rawL``, high half ``rawH``; Q halves
    ``q`` / ``r``, O^T halves ``o`` / ``u``); returns the new (m0, m1, l0, l1, o, u)."""
    sL0, sL1, sL2, sL3 = _scores(
        rawL, nb, lim, lim, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15, MASKED,
    )  # fmt: skip
    sH0, sH1, sH2, sH3 = _scores(
        rawH, nb, lim, lim, r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, False,
    )  # fmt: skip
    (
        m0, m1, l0, l1, p0, p1, p2, p3,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    ) = _fold256(
        sL0 + sH0, sL1 + sH1, sL2 + sH2, sL3 + sH3, qk_scale, m0, m1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73, LAZY,
    )  # fmt: skip
    pa = _p_frag(p0, p1)
    pb = _p_frag(p2, p3)
    (
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    ) = _pv(
        rawL, pa, pb, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40,
        o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip
    (
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    ) = _pv(
        rawH, pa, pb, u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40,
        u41, u42, u43, u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip
    return (
        m0, m1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip


@triton.jit
def _load_halves(k64, v64, ks16, vs8, pt_ptr, n0, lim, hoff, shoff, s_page, sc_page, g, t,
                 PAGE: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """The tile at ``n0`` as two ``_load_tile`` results: dims ``[0, 128)`` and ``[128, 256)`` (64 data and 8
    scale bytes further into each row)."""
    lo = _load_tile(k64, v64, ks16, vs8, pt_ptr, n0, lim, lim, hoff, shoff, s_page, sc_page, g, t, PAGE, 256, MASKED)
    hi = _load_tile(
        k64, v64, ks16, vs8, pt_ptr, n0, lim, lim, hoff + 64, shoff + 8, s_page, sc_page, g, t, PAGE, 256, MASKED,
    )  # fmt: skip
    return lo, hi


@triton.jit
def _l2_page256(pt_ptr, n0, ahead, full_end, warp, PAGE: tl.constexpr):
    """The page id of this warp's tile in the step ``ahead`` tokens past the step at ``n0`` (past the last
    full step: the one at ``n0`` again); one page a tile (16-row pages)."""
    la = n0 + ahead
    return tl.load(pt_ptr + (tl.where(la < full_end, la, n0) + 16 * warp) // PAGE).to(tl.int32)


@triton.jit
def _l2_prefetch256(k64, v64, ks16, vs8, page, hoff, shoff, s_page, sc_page, lane, L2B: tl.constexpr = 0):
    """L2 prefetch of one tile (16 rows of 128 data and 16 scale bytes a head, one page): lane ``16 kv + l``
    takes 128-byte line ``l`` of its K (kv = 0) or V rows, lane ``2 kv + l`` (< 4) scale line ``l``; with
    ``L2B`` > 0 (``_l2_prefetch``'s) lane 0 the tile's whole (page, KV head) run as one bulk copy."""
    L = lane % 32
    if L2B > 0:
        run = _page_addr(page, s_page, (k64 + (hoff >> 3)).to(tl.int64))
        return _prefetch_l2_bulk(run, (L * 0 + L2B).to(tl.int32), L == 0)
    kv = L // 16
    dbase = tl.where(kv == 0, (k64 + (hoff >> 3)).to(tl.int64), (v64 + (hoff >> 3)).to(tl.int64))
    a = _prefetch_l2(_page_addr(page, s_page, dbase + (L % 16) * 128), L < 32)
    skv = (L // 2) % 2
    sbase = tl.where(skv == 0, (ks16 + (shoff >> 1)).to(tl.int64), (vs8 + shoff).to(tl.int64))
    return a + _prefetch_l2(_page_addr(page, sc_page, sbase + (L % 2) * 128), L < 4)


# NOTE: one argument per fragment register, on purpose: see ``_mma_step``'s docstring (why the long signature)
@triton.jit
def _finish256(
    m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp, G: tl.constexpr, VST: tl.constexpr,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43, u50,
    u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
):  # fmt: skip
    """``_mma_step._finish`` (no PAIR) for both halves: dims ``[0, 128)`` from ``o``, ``[128, 256)`` from ``u``."""
    l0, l1, i0, i1 = _normalizers(l0, l1, out_scale)
    hm0 = 2 * t < G
    hm1 = 2 * t + 1 < G
    obase = o_ptr + (2 * t) * s_oh + warp * 256
    _store_frags(
        obase, g, s_oh, hm0, hm1, i0, i1, 0, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip
    _store_frags(
        obase + 128, g, s_oh, hm0, hm1, i0, i1, 0, VST,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip
    _store_lse(m0, m1, l0, l1, lse_ptr, s_oh, g, t, warp, G, 256, 0)


@triton.jit
def _mma256_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
    pt_ptr, start, end, h, qk_scale, out_scale, o_ptr, lse_ptr, s_oh,
    G: tl.constexpr, PAGE: tl.constexpr, NW: tl.constexpr, TPI: tl.constexpr, PF: tl.constexpr,
    VST: tl.constexpr = 0, VQ: tl.constexpr = 0, L2: tl.constexpr = 0, LZ: tl.constexpr = 0,
    L2B: tl.constexpr = 0, SMS: tl.constexpr = 0,
):  # fmt: skip
    """``decode_mma._mma_segment`` at head_dim 256 (no PAIR): each warp attends its 16-token tiles of
    ``[start, end)`` (``PF`` = 1: the next tile's bytes load during this one; ``L2`` with 16-row pages: the
    tile ``L2`` steps ahead prefetched into L2, as one bulk copy of ``L2B`` bytes where > 0 -- without
    ``PF`` each step's registers then load from L2) and
    stores its partial o / lse at ``o_ptr + w * 256`` / ``lse_ptr + w`` (``s_oh`` = elements between two
    heads' partials). ``LZ``: the lazy softmax (``_mma_step._step_max``). ``SMS`` > 0: the full steps' tiles
    through a shared-memory ring (``_mma_segment``'s; ``PF`` and ``L2`` off), a tile's two runs a stage."""
    tl.static_assert(TPI == 1, "head_dim 256: one 16-token tile a softmax step (registers)")
    lane, warp, g, t, k64, v64, ks16, vs8, hoff, shoff = _warp_lanes(
        k_ptr, v_ptr, ks_ptr, vs_ptr, h, s_head, sc_head, NW,
    )  # fmt: skip
    qm = g < G
    qrow = q_ptr + (h * G + g) * s_qh
    # Q^T B-fragments of both halves, loop-invariant: lane (g, t) holds head g, dims 128 j + [32t, 32t + 32)
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15 = _q_frags(qrow + 32 * t, qm, VQ)
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15 = _q_frags(qrow + 128 + 32 * t, qm, VQ)
    m0, m1, l0, l1, z = _online_init(32 * NW)
    o00, o01, o02, o03, o10, o11, o12, o13 = z, z, z, z, z, z, z, z
    o20, o21, o22, o23, o30, o31, o32, o33 = z, z, z, z, z, z, z, z
    o40, o41, o42, o43, o50, o51, o52, o53 = z, z, z, z, z, z, z, z
    o60, o61, o62, o63, o70, o71, o72, o73 = z, z, z, z, z, z, z, z
    u00, u01, u02, u03, u10, u11, u12, u13 = z, z, z, z, z, z, z, z
    u20, u21, u22, u23, u30, u31, u32, u33 = z, z, z, z, z, z, z, z
    u40, u41, u42, u43, u50, u51, u52, u53 = z, z, z, z, z, z, z, z
    u60, u61, u62, u63, u70, u71, u72, u73 = z, z, z, z, z, z, z, z
    STEP: tl.constexpr = 16 * NW
    full_end = start + (end - start) // STEP * STEP
    if L2 > 0 and PAGE == 16:  # the first L2 prefetch's page
        pl = _l2_page256(pt_ptr, start, L2 * STEP, full_end, warp, PAGE)
    if SMS > 0:
        tl.static_assert((NW == 1) & (PAGE == 16), "the ring: one warp, one page a tile")
        kbase = (k64 + (hoff >> 3)).to(tl.int64)
        ring, bars, nsteps, pn = _ring_start(
            lane, kbase, start, full_end, pt_ptr, s_page, m0, SMS, 1, _STAGE, PAGE,
        )  # fmt: skip
        i = nsteps * 0
    if PF:
        rawL, rawH = _load_halves(
            k64, v64, ks16, vs8, pt_ptr, start + 16 * warp, full_end, hoff, shoff, s_page, sc_page, g, t,
            PAGE, True,
        )  # fmt: skip
    n0 = start
    while n0 < full_end:  # NOTE: `while`, not `for`: triton 3.6's interpreter cannot run `for` over loaded bounds
        nb = n0 + 16 * warp
        if L2 > 0 and PAGE == 16:  # NOTE: pl holds the page of step n0 + L2 * STEP (loaded last step)
            _l2_prefetch256(k64, v64, ks16, vs8, pl, hoff, shoff, s_page, sc_page, lane, L2B)
            pl = _l2_page256(pt_ptr, n0, (L2 + 1) * STEP, full_end, warp, PAGE)
        if SMS > 0:  # NOTE: the stage read last step is refilled only after that step's m0 exists
            sb, pn = _ring_next(
                ring, bars, i, nsteps, pn, start, pt_ptr, kbase, s_page, lane, m0, SMS, 1, _STAGE, PAGE,
            )  # fmt: skip
            src = _ring_src(sb, _run_addr(pt_ptr, nb, kbase, s_page, PAGE))
            rawL = _ring_tile(src, g, t, 256, 0)
            rawH = _ring_tile(src, g, t, 256, 1)
            i += 1
        elif PF:  # prefetch the next step (the current tile again on the last step: no mask needed)
            nxt = tl.where(n0 + STEP < full_end, n0 + STEP, n0) + 16 * warp
            nextL, nextH = _load_halves(
                k64, v64, ks16, vs8, pt_ptr, nxt, full_end, hoff, shoff, s_page, sc_page, g, t, PAGE, False,
            )  # fmt: skip
        else:
            rawL, rawH = _load_halves(
                k64, v64, ks16, vs8, pt_ptr, nb, full_end, hoff, shoff, s_page, sc_page, g, t, PAGE, False,
            )  # fmt: skip
        (
            m0, m1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _step256(
            rawL, rawH, nb, full_end, qk_scale, m0, m1, l0, l1,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73, False, LZ,
        )  # fmt: skip
        if PF:
            rawL = nextL
            rawH = nextH
        n0 += STEP
    # the rest (< STEP tokens): one masked tile per warp
    while n0 < end:
        nb = n0 + 16 * warp
        rawL, rawH = _load_halves(
            k64, v64, ks16, vs8, pt_ptr, nb, end, hoff, shoff, s_page, sc_page, g, t, PAGE, True,
        )  # fmt: skip
        (
            m0, m1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
        ) = _step256(
            rawL, rawH, nb, end, qk_scale, m0, m1, l0, l1,
            q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
            u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73, True, LZ,
        )  # fmt: skip
        n0 += STEP
    if SMS > 0:
        _ring_close(bars, lane, m0, SMS)
    _finish256(
        m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp, G, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        u00, u01, u02, u03, u10, u11, u12, u13, u20, u21, u22, u23, u30, u31, u32, u33, u40, u41, u42, u43,
        u50, u51, u52, u53, u60, u61, u62, u63, u70, u71, u72, u73,
    )  # fmt: skip
