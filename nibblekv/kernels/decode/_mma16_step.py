"""One 32-token step of ``decode_mma16``'s loop (``S = Q K^T`` for 16 query columns, the online softmax over
the 4 lanes of a fragment row, ``O = P V``) and its epilogue, on PTX fragment registers; the layout is in
``decode_mma16``'s docstring, the long signatures' reason in ``_mma_step``'s."""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.decode._mma_tile import _softmax, _tile_regs
from nibblekv.kernels.ptx.mma import _lane_reduce, _mma, _pack_h2, _st4


@triton.jit
def _scores16(raw, qk_scale, n0, lim,
qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15, qb0, qb1, qb2, qb3,
qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15,
              MASKED: tl.constexpr):  # fmt: skip
    """S fragments of one tile times ``qk_scale``: n-tile 0 ``e`` = (column g; tokens 2t, 2t+1), (g + 8; 2t,
    2t+1); n-tile 1 ``f`` the same for tokens 8 + 2t, 9 + 2t. Tokens ``>= lim`` score -inf (MASKED)."""
    (
        kg0, kg1, kg2, kg3, kg4, kg5, kg6, kg7, kg8, kg9, kg10, kg11, kg12, kg13, kg14, kg15,
        k80, k81, k82, k83, k84, k85, k86, k87, k88, k89, k810, k811, k812, k813, k814, k815,
    ) = _tile_regs(raw, 0)  # fmt: skip
    z = tl.zeros_like(qk_scale)
    e0, e1, e2, e3 = z, z, z, z
    f0, f1, f2, f3 = z, z, z, z
    e0, e1, e2, e3 = _mma(qa0, qb0, qa1, qb1, kg0, kg1, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa0, qb0, qa1, qb1, k80, k81, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa2, qb2, qa3, qb3, kg2, kg3, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa2, qb2, qa3, qb3, k82, k83, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa4, qb4, qa5, qb5, kg4, kg5, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa4, qb4, qa5, qb5, k84, k85, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa6, qb6, qa7, qb7, kg6, kg7, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa6, qb6, qa7, qb7, k86, k87, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa8, qb8, qa9, qb9, kg8, kg9, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa8, qb8, qa9, qb9, k88, k89, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa10, qb10, qa11, qb11, kg10, kg11, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa10, qb10, qa11, qb11, k810, k811, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa12, qb12, qa13, qb13, kg12, kg13, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa12, qb12, qa13, qb13, k812, k813, f0, f1, f2, f3)
    e0, e1, e2, e3 = _mma(qa14, qb14, qa15, qb15, kg14, kg15, e0, e1, e2, e3)
    f0, f1, f2, f3 = _mma(qa14, qb14, qa15, qb15, k814, k815, f0, f1, f2, f3)
    e0, e1, e2, e3 = e0 * qk_scale, e1 * qk_scale, e2 * qk_scale, e3 * qk_scale
    f0, f1, f2, f3 = f0 * qk_scale, f1 * qk_scale, f2 * qk_scale, f3 * qk_scale
    if MASKED:
        tok = n0 + 2 * (tl.arange(0, e0.shape[0]) % 4)
        e0, e2 = tl.where(tok < lim, e0, float("-inf")), tl.where(tok < lim, e2, float("-inf"))
        e1, e3 = tl.where(tok + 1 < lim, e1, float("-inf")), tl.where(tok + 1 < lim, e3, float("-inf"))
        f0, f2 = tl.where(tok + 8 < lim, f0, float("-inf")), tl.where(tok + 8 < lim, f2, float("-inf"))
        f1, f3 = tl.where(tok + 9 < lim, f1, float("-inf")), tl.where(tok + 9 < lim, f3, float("-inf"))
    return e0, e1, e2, e3, f0, f1, f2, f3


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _rescale16(al0, al1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3):  # fmt: skip
    """Column g's accumulators (``_0``, ``_1``) times ``al0``, column g + 8's (``_2``, ``_3``) by ``al1``."""
    o0_0, o0_1, o0_2, o0_3 = o0_0 * al0, o0_1 * al0, o0_2 * al1, o0_3 * al1
    o1_0, o1_1, o1_2, o1_3 = o1_0 * al0, o1_1 * al0, o1_2 * al1, o1_3 * al1
    o2_0, o2_1, o2_2, o2_3 = o2_0 * al0, o2_1 * al0, o2_2 * al1, o2_3 * al1
    o3_0, o3_1, o3_2, o3_3 = o3_0 * al0, o3_1 * al0, o3_2 * al1, o3_3 * al1
    o4_0, o4_1, o4_2, o4_3 = o4_0 * al0, o4_1 * al0, o4_2 * al1, o4_3 * al1
    o5_0, o5_1, o5_2, o5_3 = o5_0 * al0, o5_1 * al0, o5_2 * al1, o5_3 * al1
    o6_0, o6_1, o6_2, o6_3 = o6_0 * al0, o6_1 * al0, o6_2 * al1, o6_3 * al1
    o7_0, o7_1, o7_2, o7_3 = o7_0 * al0, o7_1 * al0, o7_2 * al1, o7_3 * al1
    o8_0, o8_1, o8_2, o8_3 = o8_0 * al0, o8_1 * al0, o8_2 * al1, o8_3 * al1
    o9_0, o9_1, o9_2, o9_3 = o9_0 * al0, o9_1 * al0, o9_2 * al1, o9_3 * al1
    o10_0, o10_1, o10_2, o10_3 = o10_0 * al0, o10_1 * al0, o10_2 * al1, o10_3 * al1
    o11_0, o11_1, o11_2, o11_3 = o11_0 * al0, o11_1 * al0, o11_2 * al1, o11_3 * al1
    o12_0, o12_1, o12_2, o12_3 = o12_0 * al0, o12_1 * al0, o12_2 * al1, o12_3 * al1
    o13_0, o13_1, o13_2, o13_3 = o13_0 * al0, o13_1 * al0, o13_2 * al1, o13_3 * al1
    o14_0, o14_1, o14_2, o14_3 = o14_0 * al0, o14_1 * al0, o14_2 * al1, o14_3 * al1
    o15_0, o15_1, o15_2, o15_3 = o15_0 * al0, o15_1 * al0, o15_2 * al1, o15_3 * al1
    return (
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _pv16(raw, p0, p1, p2, p3,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3):  # fmt: skip
    """O += P V for one tile; ``p0..p3`` = P's A fragment (columns g / g + 8 x tokens 2t.. / 2t + 8..)."""
    (
        va0, va1, va2, va3, va4, va5, va6, va7, va8, va9, va10, va11, va12, va13, va14, va15,
        vb0, vb1, vb2, vb3, vb4, vb5, vb6, vb7, vb8, vb9, vb10, vb11, vb12, vb13, vb14, vb15,
    ) = _tile_regs(raw, 1)  # fmt: skip
    o0_0, o0_1, o0_2, o0_3 = _mma(p0, p1, p2, p3, va0, vb0, o0_0, o0_1, o0_2, o0_3)
    o1_0, o1_1, o1_2, o1_3 = _mma(p0, p1, p2, p3, va1, vb1, o1_0, o1_1, o1_2, o1_3)
    o2_0, o2_1, o2_2, o2_3 = _mma(p0, p1, p2, p3, va2, vb2, o2_0, o2_1, o2_2, o2_3)
    o3_0, o3_1, o3_2, o3_3 = _mma(p0, p1, p2, p3, va3, vb3, o3_0, o3_1, o3_2, o3_3)
    o4_0, o4_1, o4_2, o4_3 = _mma(p0, p1, p2, p3, va4, vb4, o4_0, o4_1, o4_2, o4_3)
    o5_0, o5_1, o5_2, o5_3 = _mma(p0, p1, p2, p3, va5, vb5, o5_0, o5_1, o5_2, o5_3)
    o6_0, o6_1, o6_2, o6_3 = _mma(p0, p1, p2, p3, va6, vb6, o6_0, o6_1, o6_2, o6_3)
    o7_0, o7_1, o7_2, o7_3 = _mma(p0, p1, p2, p3, va7, vb7, o7_0, o7_1, o7_2, o7_3)
    o8_0, o8_1, o8_2, o8_3 = _mma(p0, p1, p2, p3, va8, vb8, o8_0, o8_1, o8_2, o8_3)
    o9_0, o9_1, o9_2, o9_3 = _mma(p0, p1, p2, p3, va9, vb9, o9_0, o9_1, o9_2, o9_3)
    o10_0, o10_1, o10_2, o10_3 = _mma(p0, p1, p2, p3, va10, vb10, o10_0, o10_1, o10_2, o10_3)
    o11_0, o11_1, o11_2, o11_3 = _mma(p0, p1, p2, p3, va11, vb11, o11_0, o11_1, o11_2, o11_3)
    o12_0, o12_1, o12_2, o12_3 = _mma(p0, p1, p2, p3, va12, vb12, o12_0, o12_1, o12_2, o12_3)
    o13_0, o13_1, o13_2, o13_3 = _mma(p0, p1, p2, p3, va13, vb13, o13_0, o13_1, o13_2, o13_3)
    o14_0, o14_1, o14_2, o14_3 = _mma(p0, p1, p2, p3, va14, vb14, o14_0, o14_1, o14_2, o14_3)
    o15_0, o15_1, o15_2, o15_3 = _mma(p0, p1, p2, p3, va15, vb15, o15_0, o15_1, o15_2, o15_3)
    return (
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip


@triton.jit
def _tile16_pv(raw, e0, e1, e2, e3, f0, f1, f2, f3, c0, c1, l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3):  # fmt: skip
    """``exp2(s - c)`` of a tile's scores into the column sums ``l0`` / ``l1`` and, as fp16 P, into O."""
    e0, e1, e2, e3 = tl.exp2(e0 - c0), tl.exp2(e1 - c0), tl.exp2(e2 - c1), tl.exp2(e3 - c1)
    f0, f1, f2, f3 = tl.exp2(f0 - c0), tl.exp2(f1 - c0), tl.exp2(f2 - c1), tl.exp2(f3 - c1)
    l0 = l0 + (e0 + e1 + f0 + f1)
    l1 = l1 + (e2 + e3 + f2 + f3)
    (
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    ) = _pv16(
        raw, _pack_h2(e0, e1), _pack_h2(e2, e3), _pack_h2(f0, f1), _pack_h2(f2, f3),
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip
    return (
        l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _step16(rawA, rawB, nb, lim, qk_scale, m0, m1, l0, l1,
qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15, qb0, qb1, qb2, qb3,
qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
            TPI: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """One softmax step over ``TPI`` tiles (``rawA`` at ``nb``, ``rawB`` at ``nb + 16``) of this warp."""
    eA0, eA1, eA2, eA3, fA0, fA1, fA2, fA3 = _scores16(
        rawA, qk_scale, nb, lim,
qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15, qb0, qb1, qb2, qb3,
qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15,
        MASKED,
    )  # fmt: skip
    mx0 = tl.maximum(tl.maximum(eA0, eA1), tl.maximum(fA0, fA1))
    mx1 = tl.maximum(tl.maximum(eA2, eA3), tl.maximum(fA2, fA3))
    if TPI == 2:
        eB0, eB1, eB2, eB3, fB0, fB1, fB2, fB3 = _scores16(
            rawB, qk_scale, nb + 16, lim,
qa0, qa1, qa2, qa3, qa4, qa5, qa6, qa7, qa8, qa9, qa10, qa11, qa12, qa13, qa14, qa15, qb0, qb1, qb2, qb3,
qb4, qb5, qb6, qb7, qb8, qb9, qb10, qb11, qb12, qb13, qb14, qb15,
            MASKED,
        )  # fmt: skip
        mx0 = tl.maximum(mx0, tl.maximum(tl.maximum(eB0, eB1), tl.maximum(fB0, fB1)))
        mx1 = tl.maximum(mx1, tl.maximum(tl.maximum(eB2, eB3), tl.maximum(fB2, fB3)))
    x0, x1 = _lane_reduce(mx0, mx1, True, False)
    m0, m1, c0, c1, al0, al1 = _softmax(m0, m1, l0, l1, x0, x1)
    (
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    ) = _rescale16(
        al0, al1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip
    (
        l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    ) = _tile16_pv(
        rawA, eA0, eA1, eA2, eA3, fA0, fA1, fA2, fA3, c0, c1, l0 * al0, l1 * al1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip
    if TPI == 2:
        (
            l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
        ) = _tile16_pv(
            rawB, eB0, eB1, eB2, eB3, fB0, fB1, fB2, fB3, c0, c1, l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
        )  # fmt: skip
    return (
        m0, m1, l0, l1,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
    )  # fmt: skip


# NOTE: one argument per fragment register, on purpose: see the module docstring (why the long signature)
@triton.jit
def _finish16(m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp,
              G: tl.constexpr, D: tl.constexpr,
o0_0, o0_1, o0_2, o0_3, o1_0, o1_1, o1_2, o1_3, o2_0, o2_1, o2_2, o2_3, o3_0, o3_1, o3_2, o3_3, o4_0, o4_1,
o4_2, o4_3, o5_0, o5_1, o5_2, o5_3, o6_0, o6_1, o6_2, o6_3, o7_0, o7_1, o7_2, o7_3, o8_0, o8_1, o8_2, o8_3,
o9_0, o9_1, o9_2, o9_3, o10_0, o10_1, o10_2, o10_3, o11_0, o11_1, o11_2, o11_3, o12_0, o12_1, o12_2, o12_3,
o13_0, o13_1, o13_2, o13_3, o14_0, o14_1, o14_2, o14_3, o15_0, o15_1, o15_2, o15_3,
              ):  # fmt: skip
    """A warp's epilogue: its normalized O rows (columns g, g + 8: dims ``[32 t, 32 t + 32)``, 16-byte
    stores) and lse as partial slot ``warp`` (``_mma_segment``'s ``o_ptr`` / ``lse_ptr`` / ``s_oh``)."""
    l0, l1 = _lane_reduce(l0, l1, False, False)
    # An empty warp stores lse = -inf and o = 0, which the combine step weighs as nothing.
    i0 = tl.where(l0 > 0, out_scale / tl.maximum(l0, 1e-30), 0.0)
    i1 = tl.where(l1 > 0, out_scale / tl.maximum(l1, 1e-30), 0.0)
    hm0 = g < G
    hm1 = g + 8 < G
    base0 = o_ptr + g * s_oh + warp * D + 32 * t
    base1 = base0 + 8 * s_oh
    _st4(base0 + 0, o0_0 * i0, o2_0 * i0, o1_0 * i0, o3_0 * i0, hm0)
    _st4(base0 + 4, o4_0 * i0, o6_0 * i0, o5_0 * i0, o7_0 * i0, hm0)
    _st4(base0 + 8, o8_0 * i0, o10_0 * i0, o9_0 * i0, o11_0 * i0, hm0)
    _st4(base0 + 12, o12_0 * i0, o14_0 * i0, o13_0 * i0, o15_0 * i0, hm0)
    _st4(base0 + 16, o0_1 * i0, o2_1 * i0, o1_1 * i0, o3_1 * i0, hm0)
    _st4(base0 + 20, o4_1 * i0, o6_1 * i0, o5_1 * i0, o7_1 * i0, hm0)
    _st4(base0 + 24, o8_1 * i0, o10_1 * i0, o9_1 * i0, o11_1 * i0, hm0)
    _st4(base0 + 28, o12_1 * i0, o14_1 * i0, o13_1 * i0, o15_1 * i0, hm0)
    _st4(base1 + 0, o0_2 * i1, o2_2 * i1, o1_2 * i1, o3_2 * i1, hm1)
    _st4(base1 + 4, o4_2 * i1, o6_2 * i1, o5_2 * i1, o7_2 * i1, hm1)
    _st4(base1 + 8, o8_2 * i1, o10_2 * i1, o9_2 * i1, o11_2 * i1, hm1)
    _st4(base1 + 12, o12_2 * i1, o14_2 * i1, o13_2 * i1, o15_2 * i1, hm1)
    _st4(base1 + 16, o0_3 * i1, o2_3 * i1, o1_3 * i1, o3_3 * i1, hm1)
    _st4(base1 + 20, o4_3 * i1, o6_3 * i1, o5_3 * i1, o7_3 * i1, hm1)
    _st4(base1 + 24, o8_3 * i1, o10_3 * i1, o9_3 * i1, o11_3 * i1, hm1)
    _st4(base1 + 28, o12_3 * i1, o14_3 * i1, o13_3 * i1, o15_3 * i1, hm1)
    lse0 = tl.where(l0 > 0, m0 + tl.log2(tl.maximum(l0, 1e-30)), float("-inf"))
    lse1 = tl.where(l1 > 0, m1 + tl.log2(tl.maximum(l1, 1e-30)), float("-inf"))
    lbase = lse_ptr + g * (s_oh // D) + warp
    tl.store(lbase, lse0, mask=hm0 & (t == 0))
    tl.store(lbase + 8 * (s_oh // D), lse1, mask=hm1 & (t == 0))
