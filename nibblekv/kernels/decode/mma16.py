"""NVFP4 paged decode for 9-16 query columns per KV head (``decode_mma`` with a GQA group ``G`` > 8).

Why: ``extend_decode`` serves a short chunk's cached prefix as a decode whose columns are (query token,
query head) pairs -- 16 at a 4-token chunk and GQA 4. ``decode_mma`` scores 8 columns (the n-dimension of
``mma.sync.m16n8k16``), so 16 columns were two programs that each read and converted the whole prefix
(0.33 of the H200's read ceiling vs 0.70 for one). Here one warp scores 16 columns from one conversion.

Layout (lane ``L``: ``g = L // 4``, ``t = L % 4``; columns ``g`` and ``g + 8``), FlashAttention-2 style:

* ``S = Q K^T``: Q is the loop-invariant A operand (rows = columns ``g``, ``g + 8``; 32 registers), each
  key row the B operand of one 8-token n-tile. A key row's registers from ``_k_row`` are, unchanged, its
  B fragment: ``_k_row``'s output ``2 kk + j`` holds the k-step ``kk`` dims that ``decode_mma``'s A fragment
  puts in register ``2 j`` -- the same dims a B fragment's register ``j`` holds. So the tile's rows ``g``
  and ``g + 8`` are n-tiles 0 and 1 (tokens ``2t, 2t + 1`` and ``8 + 2t, 9 + 2t`` of the accumulators).
* ``O = P V``: the score accumulators of the two n-tiles are, packed to fp16, P's A fragment (no
  transpose); V's B fragment for 8 dims is one ``_v_pair`` output of tokens (2t, 2t+1) and one of
  (2t+8, 2t+9): output ``i`` of lane ``(g, t)`` is dim ``16 g + PERM[i]``, so n-tile ``i`` covers dims
  ``16 n + PERM[i]`` and its accumulators give lane ``(g, t)`` dims ``32 t + PERM[i]`` (+ 16): each lane
  ends up with dims ``[32 t, 32 t + 32)`` of both its columns (64 accumulators).
* Softmax rows are columns; their max / sum run over the 4 lanes that share ``g`` (``_lane_reduce``).

Against ``decode_mma``: twice the tensor-core work per byte and twice the rescale (64 ``HMMA`` and 80
``FMUL`` of a 32-token step's 871 sm_90 instructions, vs 32 and 40 of 776) for twice the columns, and 64
accumulators: the launcher runs ``decode.knobs.WIDE_PPSM`` programs per SM, too few warps to hide the next
step's loads, so each step also prefetches the tiles ``L2`` steps ahead into L2 (``WIDE_L2``). Same partial
slots as ``_mma_segment``; no PAIR. The step and the epilogue are in ``_mma16_step``; they take every
fragment as its own argument for the reason given in ``_mma_step``'s docstring (registers, not a tensor
with another layout).
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma16_step import _finish16, _step16
from nibblekv.kernels.decode._mma_tile import (
    _l2_pages,
    _l2_prefetch,
    _load_tile,
    _online_init,
    _q_frags,
    _warp_lanes,
)


@triton.jit
def _mma16_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
    pt_ptr, start, end, end1, h, qk_scale, out_scale, o_ptr, lse_ptr, s_oh,
    G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, NW: tl.constexpr, TPI: tl.constexpr,
    PF: tl.constexpr, PAIR: tl.constexpr = 0, VST: tl.constexpr = 0, VQ: tl.constexpr = 0,
    L2: tl.constexpr = 0,
    qtok0=0, qcol0=0, s_qt=0, q_last=0, QG: tl.constexpr = 0,
):  # fmt: skip
    """``_mma_segment``'s contract for 8 < ``G`` <= 16 columns (``end1`` and ``VST`` unused: no PAIR, and
    the stores are always 16-byte vectors).

    ``L2`` > 0 (with ``PF``, 16-row pages): each step starts with an L2 prefetch of the tiles ``L2`` steps
    ahead (page ids loaded a step before). Why: at 8 one-warp programs per SM (two a scheduler) ptxas issues
    the register prefetch of the next step only ~260 of the step's ~760 instructions before it is used --
    less than a loaded DRAM round trip -- and there are no other warps to cover the wait.

    ``QG`` > 0 (``decode_triton``'s ``q_rows``): ``q_ptr`` is the real ``q [T, Hq, D]`` (token stride
    ``s_qt``, head stride ``s_qh``) and column ``c`` of KV head ``h`` is virtual column ``qcol0 + c``: token
    ``min(qtok0 + (qcol0 + c) // QG, q_last)``, head ``h * QG + (qcol0 + c) % QG`` -- ``extend_decode``'s
    gather, done by the loads themselves."""
    tl.static_assert(PAIR == 0, "decode_mma16: no PAIR")
    tl.static_assert(D == 128, "decode_mma16: head_dim 128")
    lane, warp, g, t, k64, v64, ks16, vs8, hoff, shoff = _warp_lanes(
        k_ptr, v_ptr, ks_ptr, vs_ptr, h, s_head, sc_head, NW,
    )  # fmt: skip
    # Q's A fragments, loop-invariant: columns g (qa) and g + 8 (qb), dims [32t, 32t + 32) in k-step order
    gb = tl.minimum(g + 8, G - 1)
    if QG > 0:
        ca, cb = qcol0 + g, qcol0 + gb
        ra = tl.minimum(qtok0 + ca // QG, q_last).to(tl.int64) * s_qt
        rb = tl.minimum(qtok0 + cb // QG, q_last).to(tl.int64) * s_qt
        qpa = q_ptr + ra + (h * QG + ca % QG) * s_qh + 32 * t
        qpb = q_ptr + rb + (h * QG + cb % QG) * s_qh + 32 * t
    else:
        qpa = q_ptr + (h * G + g) * s_qh + 32 * t
        qpb = q_ptr + (h * G + gb) * s_qh + 32 * t
    qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15 = _q_frags(
        qpa, g < G, VQ
    )
    # NOTE: columns past G read nothing (masked); their scores are 0 and their rows are never stored
    qb0, qb1, qb2, qb3, qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15 = _q_frags(
        qpb, g + 8 < G, VQ
    )
    m0, m1, l0, l1, z = _online_init(32 * NW)
    o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3 = z, z, z, z, z, z, z, z
    o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3 = z, z, z, z, z, z, z, z
    o4_0, o4_1, o4_2, o4_3, o5_0, o5_1, o5_2, o5_3 = z, z, z, z, z, z, z, z
    o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3 = z, z, z, z, z, z, z, z
    o8_0, o8_1, o8_2, o8_3, o9_0, o9_1, o9_2, o9_3 = z, z, z, z, z, z, z, z
    o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3 = z, z, z, z, z, z, z, z
    o12_0, o12_1, o12_2, o12_3, o13_0, o13_1, o13_2, o13_3 = z, z, z, z, z, z, z, z
    o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3 = z, z, z, z, z, z, z, z
    STEP: tl.constexpr = 16 * NW * TPI
    full_end = start + (end - start) // STEP * STEP
    if PF:
        nb = start + 16 * TPI * warp
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, nb, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
            PAGE, D, True,
        )  # fmt: skip
        rawB = rawA
        if TPI == 2:
            rawB = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nb + 16, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, True,
            )  # fmt: skip
        if L2 > 0 and PAGE == 16:  # the first L2 prefetch's pages (past the last full step: this one again)
            pl = _l2_pages(pt_ptr, start, L2 * STEP, full_end, lane, warp, TPI, PAGE)
    n0 = start
    # NOTE: `while`, not `for`: triton 3.6's interpreter cannot run `for` over loaded bounds
    while n0 < full_end:
        nb = n0 + 16 * TPI * warp
        if PF:  # prefetch the next step (the current tiles again on the last step: no mask needed)
            if L2 > 0 and PAGE == 16:  # NOTE: pl holds the pages of step n0 + L2 * STEP (loaded last step)
                _l2_prefetch(k64, v64, ks16, vs8, pl, hoff, shoff, s_page, sc_page, lane, TPI, PAGE, D)
                pl = _l2_pages(pt_ptr, n0, (L2 + 1) * STEP, full_end, lane, warp, TPI, PAGE)
            nxt = tl.where(n0 + STEP < full_end, n0 + STEP, n0) + 16 * TPI * warp
            nextA = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nxt, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, False,
            )  # fmt: skip
            nextB = nextA
            if TPI == 2:
                nextB = _load_tile(
                    k64, v64, ks16, vs8, pt_ptr, nxt + 16, full_end, full_end, hoff, shoff, s_page, sc_page,
                    g, t, PAGE, D, False,
                )  # fmt: skip
        else:
            rawA = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nb, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, False,
            )  # fmt: skip
            rawB = rawA
            if TPI == 2:
                rawB = _load_tile(
                    k64, v64, ks16, vs8, pt_ptr, nb + 16, full_end, full_end, hoff, shoff, s_page, sc_page,
                    g, t, PAGE, D, False,
                )  # fmt: skip
        (
            m0, m1, l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
        ) = _step16(
            rawA, rawB, nb, full_end, qk_scale, m0, m1, l0, l1,
qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15, qb0, qb1, qb2, qb3,
qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
            TPI, False,
        )  # fmt: skip
        if PF:
            rawA = nextA
            rawB = nextB
        n0 += STEP
    # the rest (< STEP tokens): one masked tile per warp and step
    while n0 < end:
        nb = n0 + 16 * warp
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, nb, end, end, hoff, shoff, s_page, sc_page, g, t, PAGE, D, True
        )
        (
            m0, m1, l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
        ) = _step16(
            rawA, rawA, nb, end, qk_scale, m0, m1, l0, l1,
qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15, qb0, qb1, qb2, qb3,
qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
            1, True,
        )  # fmt: skip
        n0 += 16 * NW
    _finish16(
        m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp, G, D,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip
