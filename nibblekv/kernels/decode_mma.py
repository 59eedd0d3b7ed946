"""NVFP4 paged decode with hand-placed tensor-core fragments (variant ``mma`` of ``decode_triton``).

Why: Triton's ``tl.dot`` path (``decode_tok``) pads the GQA group to 16 rows, re-reads Q from shared
memory every block and sends the dequantized V tile through shared memory for a transpose; at 4 bits
that glue, not the bytes, sets the speed (0.22-0.31 of the H200's read ceiling). Here every value goes
from global memory straight into the register that ``mma.sync.m16n8k16`` reads, converted in place:

* The program is ``NW`` warps; each warp owns 16-token tiles and keeps its own softmax state, written
  as its own split (slot ``sp * NW + warp``; ``combine._combine_kernel`` merges all slots).
* Every tensor is ``[32 * NW]``: one element per thread (Triton's default 1-D layout), so lane ``L``
  (``g = L // 4``, ``t = L % 4``) holds exactly its PTX fragment registers. NOTE: this holds only while
  no op gives these tensors another layout -- addresses are never contiguous across lanes (no vectorized
  load layout), and there are no Triton reductions; the warp-collective steps are inline PTX.
* Scores as ``S^T = K Q^T``: the K tile ``[16 tokens, 16 dims]`` is the A operand (rows = tokens ``g``,
  ``g + 8``), ``Q^T`` the loop-invariant B operand ``[16 dims, 8 heads]`` (GQA groups up to 8, no
  16-row padding). Lane ``t`` loads bytes ``[16t, 16t + 16)`` of each key row (blocks ``2t``, ``2t + 1``):
  k-step ``kk`` uses word ``kk // 2``; Q is gathered once in the same permuted dim order.
* ``O^T += V^T P^T``: V's A operand wants token pairs per register; lane ``(g, t)`` loads block ``g``
  (8 bytes) of tokens ``2t, 2t+1, 2t+8, 2t+9`` and ``prmt`` pairs two tokens' 16-bit halves, so each
  converted half2 is (token ``2t``, token ``2t+1``) of one dim, and the V block scales of those two tokens
  form one half2 too. ``P^T`` comes from the score fragment by one ``movmatrix.trans`` per 8 tokens.
* The pool keeps NVFP4 words in sm bit order (``nibblekv.formats.sm_words``): 6 masks, a shift and two
  multiplies make a word's 8 nibbles 4 half2 of fp16 bits ``value * 2**-14`` (``_mma_ptx._cvt_word_sm``);
  the block scale multiplies as half2 (exact but for products under 2**-14 with scales under 2**-10, see
  ``_cvt_word_sm``). V pairs two tokens' low (high) 16-bit halves with one ``prmt``. Why not E4M3 bytes +
  ``cvt.rn.f16x2.e4m3x2`` on the standard order (the kernel until stop 38): that is 9 ALU-pipe ops a word,
  this 6, and Hopper's ALU pipe issues at half rate -- it, not the instruction count, limited the kernel.

GPU only (sm_89+: E4M3 conversion, ``movmatrix``); head_dim 128, GQA group <= 8, NVFP4 pools with packed
scale rows. Under the interpreter each PTX helper has a Triton twin on the same packed registers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._mma_ptx import (
    _lazy_step,
    _ld4,
    _max8,
    _mma,
    _mma_bf16,
    _p_frag,
    _p_frag_bf16,
    _pack_h2,
    _st4,
    _sum8,
)
from nibblekv.kernels._mma_tile import (
    _k_tile,
    _l2_pages,
    _l2_prefetch,
    _load_tile,
    _q_frags,
    _softmax,
    _v_tile,
)
from nibblekv.kernels._common import interpreting
from nibblekv.kernels._pdl import pdl_enter
from nibblekv.kernels._tma import tma_init, tma_issue, tma_read, tma_ring
from nibblekv.kernels.decode_fixup import fixup
from nibblekv.kernels.decode_mma16 import _mma16_segment
from nibblekv.kernels.decode_tok import _tok_segment

_INTERP = tl.constexpr(interpreting())


@triton.jit
def _scores(raw, qk_scale, n0, lim, lim1,
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            MASKED: tl.constexpr):  # fmt: skip
    """S^T fragment of one tile, times ``qk_scale``: (token g, head 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).

    Masked (MASKED: token >= lim; columns 2t+1 token >= lim1, see PAIR in ``_mma_segment``) scores are
    -inf. ``n0`` is this warp's tile start.
    """
    (
        kg0, kg1, kg2, kg3, kg4, kg5, kg6, kg7, kg8, kg9, kg10, kg11, kg12, kg13, kg14, kg15,
        k80, k81, k82, k83, k84, k85, k86, k87, k88, k89, k810, k811, k812, k813, k814, k815,
    ) = _k_tile(raw)  # fmt: skip
    z = tl.zeros_like(qk_scale)
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
    s0 = (e0 + f0) * qk_scale
    s1 = (e1 + f1) * qk_scale
    s2 = (e2 + f2) * qk_scale
    s3 = (e3 + f3) * qk_scale
    if MASKED:
        g = (tl.arange(0, s0.shape[0]) % 32) // 4
        s0 = tl.where(n0 + g < lim, s0, float("-inf"))
        s1 = tl.where(n0 + g < lim1, s1, float("-inf"))
        s2 = tl.where(n0 + g + 8 < lim, s2, float("-inf"))
        s3 = tl.where(n0 + g + 8 < lim1, s3, float("-inf"))
    return s0, s1, s2, s3


@triton.jit
def _pv(raw, pa, pb,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ):  # fmt: skip
    """O^T += V^T P^T for one tile (``pa``/``pb``: P^T fragments of tokens 2t, 2t+1 / 2t+8, 2t+9)."""
    (
        va0, va1, va2, va3, va4, va5, va6, va7, va8, va9, va10, va11, va12, va13, va14, va15,
        vb0, vb1, vb2, vb3, vb4, vb5, vb6, vb7, vb8, vb9, vb10, vb11, vb12, vb13, vb14, vb15,
    ) = _v_tile(raw)  # fmt: skip
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
def _step_max(
    m0, m1, l0, l1, mx0, mx1,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    LZ: tl.constexpr = 0,
):  # fmt: skip
    """``_advance`` to the column max of this lane's step maxima ``mx0/mx1`` (the shuffles included).

    ``LZ`` > 0 (variant option ``lz``, lazy rescale): while no lane's step max exceeds the running max by
    more than ``LZ`` (log2 units), the running max stays, so the step skips the column-max shuffles and the
    O^T / sum rescale (the common case once a long context has seen its largest scores). Exact: scores
    subtract the max the sums were kept at, and ``p`` <= 2**LZ fits the fp16 P operand with its relative
    precision unchanged. NOTE: the decision is warp-uniform (``vote.all`` over the warp's lanes; one PTX
    block, see ``_mma_ptx._lazy_step_ptx``).
    """
    if LZ and not _INTERP:
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42,
            o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _lazy_step(
            m0, m1, l0, l1, mx0, mx1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31,
            o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            tl.full(mx0.shape, LZ, tl.float32),
        )  # fmt: skip
    else:
        # the interpreter's twin of _lazy_step with LZ (without, c0 / c1 are dead: _advance sets them)
        c0 = tl.where(m0 > float("-inf"), m0, 0.0)
        c1 = tl.where(m1 > float("-inf"), m1, 0.0)
        slow = True
        if LZ:
            slow = tl.min(((mx0 <= m0 + LZ) & (mx1 <= m1 + LZ)).to(tl.int32), axis=0) == 0
        if slow:
            x0, x1 = _max8(mx0, mx1)
            (
                m0, m1, c0, c1, l0, l1,
                o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42,
                o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            ) = _advance(
                m0, m1, l0, l1, x0, x1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31,
                o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            )  # fmt: skip
    return (
        m0, m1, c0, c1, l0, l1,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


@triton.jit
def _run_step(
    rawA, rawB, nb, lim, lim1, qk_scale, m0, m1, l0, l1,
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    TPI: tl.constexpr, MASKED: tl.constexpr, LZ: tl.constexpr = 0,
):  # fmt: skip
    """One softmax step over ``TPI`` tiles (``rawA``, ``rawB``) of this warp at ``nb``; returns the new
    (m0, m1, l0, l1, O^T fragments)."""
    if TPI == 2:
        sA0, sA1, sA2, sA3 = _scores(
            rawA, qk_scale, nb + 0, lim, lim1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            MASKED,
        )  # fmt: skip
        sB0, sB1, sB2, sB3 = _scores(
            rawB, qk_scale, nb + 16, lim, lim1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            MASKED,
        )  # fmt: skip
        mx0 = tl.maximum(tl.maximum(sA0, sA2), tl.maximum(sB0, sB2))
        mx1 = tl.maximum(tl.maximum(sA1, sA3), tl.maximum(sB1, sB3))
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_max(
            m0, m1, l0, l1, mx0, mx1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31,
            o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73, LZ,
        )  # fmt: skip
        pA0, pA1 = tl.exp2(sA0 - c0), tl.exp2(sA1 - c1)
        pA2, pA3 = tl.exp2(sA2 - c0), tl.exp2(sA3 - c1)
        pB0, pB1 = tl.exp2(sB0 - c0), tl.exp2(sB1 - c1)
        pB2, pB3 = tl.exp2(sB2 - c0), tl.exp2(sB3 - c1)
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
            rawA, qk_scale, nb + 0, lim, lim1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15,
            MASKED,
        )  # fmt: skip
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_max(
            m0, m1, l0, l1, tl.maximum(sA0, sA2), tl.maximum(sA1, sA3), o00, o01, o02, o03, o10, o11, o12,
            o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61,
            o62, o63, o70, o71, o72, o73, LZ,
        )  # fmt: skip
        pA0, pA1 = tl.exp2(sA0 - c0), tl.exp2(sA1 - c1)
        pA2, pA3 = tl.exp2(sA2 - c0), tl.exp2(sA3 - c1)
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
def _finish(
    m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp,
    G: tl.constexpr, D: tl.constexpr, PAIR: tl.constexpr, VST: tl.constexpr,
    o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50,
    o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
):  # fmt: skip
    """A warp's epilogue: normalize its O^T fragments and store them and the lse as partial slot ``warp``
    (``_mma_segment``'s ``o_ptr`` / ``lse_ptr`` / ``s_oh``)."""
    l0, l1 = _sum8(l0, l1)
    # An empty warp stores lse = -inf and o = 0, which the combine step weighs as nothing.
    i0 = tl.where(l0 > 0, out_scale / tl.maximum(l0, 1e-30), 0.0)
    i1 = tl.where(l1 > 0, out_scale / tl.maximum(l1, 1e-30), 0.0)
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

    lse0 = tl.where(l0 > 0, m0 + tl.log2(tl.maximum(l0, 1e-30)), float("-inf"))
    lse1 = tl.where(l1 > 0, m1 + tl.log2(tl.maximum(l1, 1e-30)), float("-inf"))
    if PAIR:
        lbase = lse_ptr + t * (s_oh // DO) + 2 * warp
        tl.store(lbase, lse0, mask=(t < G) & (g == 0))
        tl.store(lbase + 1, lse1, mask=(t < G) & (g == 0))
    else:
        lbase = lse_ptr + (2 * t) * (s_oh // D) + warp
        tl.store(lbase, lse0, mask=hm0 & (g == 0))
        tl.store(lbase + s_oh // D, lse1, mask=hm1 & (g == 0))


@triton.jit
def _tma_fill(scratch, lane, i, n_tiles, start, src, dep0, dep1, PAGE: tl.constexpr, D: tl.constexpr,
              NS: tl.constexpr):  # fmt: skip
    """Lane 0 starts the bulk copy of tile ``i`` (rows ``start + 16 i``, if ``i < n_tiles``) into stage
    ``i % NS`` (``_tma``); ``src`` = (k, v, k-scale, v-scale, page-table pointers, head offsets, page strides)."""
    k_ptr, v_ptr, ks_ptr, vs_ptr, pt_ptr, hoff, shoff, s_page, sc_page = src
    n = start + 16 * i
    ok = i < n_tiles
    page = tl.load(pt_ptr + n // PAGE, mask=ok, other=0).to(tl.int64)
    tok = (n % PAGE).to(tl.int64)
    zero = (lane * 0).to(tl.int64)
    d = zero + page * s_page + hoff + tok * (D // 2)
    s = zero + page * sc_page + shoff + tok * (D // 16)
    u8: tl.constexpr = tl.pointer_type(tl.uint8)
    tma_issue(
        scratch, ((lane % 32) == 0) & ok, zero + i % NS, k_ptr.to(u8) + d, v_ptr.to(u8) + d,
        ks_ptr.to(u8) + s, vs_ptr.to(u8) + s, dep0, dep1,
    )  # fmt: skip


@triton.jit
def _mma_segment(
    q_ptr, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
    pt_ptr, start, end, end1, h, qk_scale, out_scale, o_ptr, lse_ptr, s_oh,
    G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, NW: tl.constexpr, TPI: tl.constexpr, PF: tl.constexpr,
    PAIR: tl.constexpr = 0, VST: tl.constexpr = 0, VQ: tl.constexpr = 0,
    TMA: tl.constexpr = 0, scratch=None, LZ: tl.constexpr = 0, L2: tl.constexpr = 0,
):  # fmt: skip
    """Each warp attends its tiles of ``[start, end)`` (``TPI`` 16-token tiles per softmax step; ``PF`` = 1:
    the next step's bytes load during this one) and stores its partial o / lse at ``o_ptr + w * D`` /
    ``lse_ptr + w`` (``s_oh`` = elements between two heads' partials).

    ``PAIR``: a head_dim-64 pool read as head_dim 128 -- each "row" is two consecutive tokens (their bytes
    and scale bytes are adjacent), rows ``[start, end)``, the second token valid below row ``end1``. The 8
    fragment columns are (head ``c // 2``, token parity ``c % 2``): Q of head ``c // 2`` sits in dims
    ``[64 p, 64 p + 64)`` and zeros elsewhere, so column (h, p) scores exactly the tokens of parity p, and
    its output is dims ``[64 p, 64 p + 64)`` of O^T (the other half mixes the wrong tokens and is dropped).
    Each (head, parity) is its own softmax partial: slots ``2 w`` and ``2 w + 1`` of ``D / 2`` dims; the
    combine step merges them like splits. GQA groups <= 4.

    ``VST``: the partial o as 16-byte vector stores (8 per lane) instead of 32 scalar ones, each of which
    touches 32 sectors -- the whole grid stores at once at its end (one wave), so the epilogue is a burst.
    ``VQ``: Q (bf16, rows 16-byte aligned) as 4 vector loads per lane, for the same reason at the start.
    ``TMA``: the whole-step tiles staged through a ring of that many tiles in shared memory by bulk copies
    (``_tma``; one warp, pages of a multiple of 16 rows); ``scratch`` is the ring under the interpreter.
    ``L2`` (with ``PF``, 16-row pages, no PAIR / TMA; variant option ``l2``): ``decode_mma16``'s L2 prefetch
    of the tiles ``L2`` steps ahead. Gained nothing at 16 programs per SM (stop 37); opt-in for 12.
    """
    lane = tl.arange(0, 32 * NW)
    warp = lane // 32
    g = (lane % 32) // 4
    t = lane % 4
    k64 = k_ptr.to(tl.pointer_type(tl.uint64))
    v64 = v_ptr.to(tl.pointer_type(tl.uint64))
    ks16 = ks_ptr.to(tl.pointer_type(tl.uint16))  # E4M3 scale bytes, read as raw bits
    vs8 = vs_ptr.to(tl.pointer_type(tl.uint8))
    hoff = h.to(tl.int64) * s_head
    shoff = h.to(tl.int64) * sc_head
    # Q^T B-fragments, loop-invariant: lane (g, t) holds head g, dims [32t, 32t + 32) in k-step order
    if PAIR:  # column g = (head g // 2, parity g % 2): dims [64 p, 64 p + 64) hold that head's Q
        qm = (g // 2 < G) & (t // 2 == g % 2)
        qrow = q_ptr + (h * G + g // 2) * s_qh - 64 * (g % 2)
    else:
        qm = g < G
        qrow = q_ptr + (h * G + g) * s_qh
    # NOTE: with VQ the lane's 32 dims are 64 contiguous bytes: 4 vector loads instead of 32 scattered ones
    q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11, q12, q13, q14, q15 = _q_frags(qrow + 32 * t, qm, VQ)
    m0 = tl.full([32 * NW], float("-inf"), tl.float32)
    m1 = m0
    z = tl.zeros([32 * NW], tl.float32)
    l0, l1 = z, z
    o00, o01, o02, o03 = z, z, z, z
    o10, o11, o12, o13 = z, z, z, z
    o20, o21, o22, o23 = z, z, z, z
    o30, o31, o32, o33 = z, z, z, z
    o40, o41, o42, o43 = z, z, z, z
    o50, o51, o52, o53 = z, z, z, z
    o60, o61, o62, o63 = z, z, z, z
    o70, o71, o72, o73 = z, z, z, z
    STEP: tl.constexpr = 16 * NW * TPI
    full_end = start + (end1 - start) // STEP * STEP  # NOTE: end1 == end unless PAIR
    lim = full_end
    lim1 = full_end
    if TMA:  # NOTE: one warp (warp == 0, STEP == 16 * TPI): tile i of the segment is rows start + 16 i
        tl.static_assert(NW == 1, "tma: one warp per program")
        tma_init(scratch, lane, TMA)
        n_tiles = (full_end - start) // 16
        src = (k_ptr, v_ptr, ks_ptr, vs_ptr, pt_ptr, hoff, shoff, s_page, sc_page)
        for i in tl.static_range(TMA):  # the ring's first fill
            _tma_fill(scratch, lane, i, n_tiles, start, src, z, z, PAGE, D, TMA)
        it = 0
        n0 = start
        while n0 < full_end:
            rawA = tma_read(scratch, lane * 0 + it % TMA, lane * 0 + (it // TMA) % 2, lane)
            rawB = rawA
            if TPI == 2:
                rawB = tma_read(scratch, lane * 0 + (it + 1) % TMA, lane * 0 + ((it + 1) // TMA) % 2, lane)
            (
                m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
                o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            ) = _run_step(
                rawA, rawB, n0, lim, lim1, qk_scale, m0, m1, l0, l1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10,
                q11, q12, q13, q14, q15, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32,
                o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
                TPI, False, LZ,
            )  # fmt: skip
            for j in tl.static_range(TPI):  # refill the stages this step read (m0, o00: read before)
                _tma_fill(scratch, lane, it + j + TMA, n_tiles, start, src, m0, o00, PAGE, D, TMA)
            it += TPI
            n0 += STEP
    if PF and not TMA:
        nb = start + 16 * TPI * warp
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, nb, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
            PAGE, D, True, PAIR,
        )
        rawB = rawA
        if TPI == 2:
            rawB = _load_tile(
                k64, v64, ks16, vs8, pt_ptr, nb + 16, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                PAGE, D, True, PAIR,
            )
        if L2 > 0 and PAGE == 16 and PAIR == 0:  # the first L2 prefetch's pages (as decode_mma16's)
            pl = _l2_pages(pt_ptr, start, L2 * STEP, full_end, lane, warp, TPI, PAGE)
    if not TMA:
        n0 = start
        while (
            n0 < full_end
        ):  # NOTE: `while`, not `for`: triton 3.6's interpreter cannot run `for` over loaded bounds
            nb = n0 + 16 * TPI * warp
            if PF:  # prefetch the next step (the current tiles again on the last step: no mask needed)
                if L2 > 0 and PAGE == 16 and PAIR == 0:  # NOTE: pl holds the pages of step n0 + L2 * STEP
                    _l2_prefetch(k64, v64, ks16, vs8, pl, hoff, shoff, s_page, sc_page, lane, TPI, PAGE, D)
                    pl = _l2_pages(pt_ptr, n0, (L2 + 1) * STEP, full_end, lane, warp, TPI, PAGE)
                nxt = tl.where(n0 + STEP < full_end, n0 + STEP, n0) + 16 * TPI * warp
                nextA = _load_tile(
                    k64, v64, ks16, vs8, pt_ptr, nxt, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                    PAGE, D, False, PAIR,
                )
                nextB = nextA
                if TPI == 2:
                    nextB = _load_tile(
                        k64, v64, ks16, vs8, pt_ptr, nxt + 16, full_end, full_end, hoff, shoff, s_page, sc_page,
                        g, t, PAGE, D, False, PAIR,
                    )
            else:
                rawA = _load_tile(
                    k64, v64, ks16, vs8, pt_ptr, nb, full_end, full_end, hoff, shoff, s_page, sc_page, g, t,
                    PAGE, D, False, PAIR,
                )
                rawB = rawA
                if TPI == 2:
                    rawB = _load_tile(
                        k64, v64, ks16, vs8, pt_ptr, nb + 16, full_end, full_end, hoff, shoff, s_page, sc_page,
                        g, t, PAGE, D, False, PAIR,
                    )
            (
                m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
                o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
            ) = _run_step(
                rawA, rawB, nb, lim, lim1, qk_scale, m0, m1, l0, l1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11,
                q12, q13, q14, q15, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
                o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73, TPI, False,
                LZ,
            )  # fmt: skip
            if PF:
                rawA = nextA
                rawB = nextB
            n0 += STEP
    # the rest (< STEP tokens): one masked tile per warp and step
    lim = end
    lim1 = end1
    while n0 < end:
        nb = n0 + 16 * warp
        rawA = _load_tile(
            k64, v64, ks16, vs8, pt_ptr, nb, end, end1, hoff, shoff, s_page, sc_page, g, t,
            PAGE, D, True, PAIR,
        )
        (
            m0, m1, l0, l1, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _run_step(
            rawA, rawA, nb, lim, lim1, qk_scale, m0, m1, l0, l1, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q10, q11,
            q12, q13, q14, q15, o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33,
            o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73, 1, True, LZ,
        )  # fmt: skip
        n0 += 16 * NW
    _finish(
        m0, m1, l0, l1, out_scale, o_ptr, lse_ptr, s_oh, g, t, warp, G, D, PAIR, VST,
        o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
        o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# the bf16 tail as one more program of the grid (bf16 mma.sync on the same fragment layout)
# ----------------------------------------------------------------------------------------------------
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
def _mma_tail(q_ptr, s_qh, tk, tv, t_page, t_head, t_tok, tpt_ptr, n, h, qk_scale, o_ptr, lse_ptr, s_oh,
              G: tl.constexpr, D: tl.constexpr, TPAGE: tl.constexpr, VST: tl.constexpr,
              PAIR: tl.constexpr = 0, TPP: tl.constexpr = 0, part=0, PARTS: tl.constexpr = 1):  # fmt: skip
    """One warp attends the ``n`` bf16 tail tokens of KV head ``h`` and stores partial slot 0 at ``o_ptr``.

    ``PARTS > 1``: only part ``part`` of ``PARTS`` (whole 16-row tiles each, the last ones may be empty),
    so that many one-warp programs share a tail (variant option ``ts``).

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
    q0, q1, q2, q3 = _q_bf16(qrow, 0, qm), _q_bf16(qrow, 2, qm), _q_bf16(qrow, 4, qm), _q_bf16(qrow, 6, qm)
    q4, q5, q6, q7 = _q_bf16(qrow, 8, qm), _q_bf16(qrow, 10, qm), _q_bf16(qrow, 12, qm), _q_bf16(qrow, 14, qm)
    q8, q9, q10, q11 = _q_bf16(qrow, 16, qm), _q_bf16(qrow, 18, qm), _q_bf16(qrow, 20, qm), _q_bf16(qrow, 22, qm)
    q12, q13 = _q_bf16(qrow, 24, qm), _q_bf16(qrow, 26, qm)
    q14, q15 = _q_bf16(qrow, 28, qm), _q_bf16(qrow, 30, qm)
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
    n0 = n * 0
    r1 = lim
    if PARTS > 1:  # rows [n0, r1): this part's whole tiles
        span = tl.cdiv(tl.cdiv(lim, PARTS), 16) * 16
        n0 = part * span
        r1 = tl.minimum(lim, n0 + span)
    nt = step * lim  # tokens: a row's index bound in _tail_rows
    ONE: tl.constexpr = TPP * (TPAGE % (16 * (1 + PAIR)) == 0)  # NOTE: tiles start at multiples of 16 rows
    pg = n0.to(tl.int64)
    if ONE:
        pg = tl.load(tpt_ptr + (step * n0) // TPAGE, mask=n0 < r1, other=0).to(tl.int64)
    while n0 < r1:
        pg_next = pg
        if ONE:  # the next tile's page id, in flight while this tile is attended
            pg_next = tl.load(tpt_ptr + (step * (n0 + 16)) // TPAGE, mask=n0 + 16 < r1, other=0).to(tl.int64)
        # S^T = K Q^T: rows g, g + 8 of the tile, this lane's 32 dims (4 words per k-step pair)
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
        a0, a1, a2, a3, a4, a5, a6, a7 = _ld16(kp + 32 * t, kmg)
        a8, a9, a10, a11, a12, a13, a14, a15 = _ld16(kp + 32 * t + 16, kmg)
        b0, b1, b2, b3, b4, b5, b6, b7 = _ld16(kp8 + 32 * t, km8)
        b8, b9, b10, b11, b12, b13, b14, b15 = _ld16(kp8 + 32 * t + 16, km8)
        e0, e1, e2, e3 = _mma_bf16(a0, b0, a1, b1, q0, q1, z, z, z, z)
        f0, f1, f2, f3 = _mma_bf16(a2, b2, a3, b3, q2, q3, z, z, z, z)
        e0, e1, e2, e3 = _mma_bf16(a4, b4, a5, b5, q4, q5, e0, e1, e2, e3)
        f0, f1, f2, f3 = _mma_bf16(a6, b6, a7, b7, q6, q7, f0, f1, f2, f3)
        e0, e1, e2, e3 = _mma_bf16(a8, b8, a9, b9, q8, q9, e0, e1, e2, e3)
        f0, f1, f2, f3 = _mma_bf16(a10, b10, a11, b11, q10, q11, f0, f1, f2, f3)
        e0, e1, e2, e3 = _mma_bf16(a12, b12, a13, b13, q12, q13, e0, e1, e2, e3)
        f0, f1, f2, f3 = _mma_bf16(a14, b14, a15, b15, q14, q15, f0, f1, f2, f3)
        s0 = tl.where(mg, (e0 + f0) * qk_scale, float("-inf"))
        s1 = tl.where(mg1, (e1 + f1) * qk_scale, float("-inf"))  # PAIR: column 2t+1 has parity 1
        s2 = tl.where(m8, (e2 + f2) * qk_scale, float("-inf"))
        s3 = tl.where(m81, (e3 + f3) * qk_scale, float("-inf"))
        (
            m0, m1, c0, c1, l0, l1,
            o00, o01, o02, o03, o10, o11, o12, o13, o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43,
            o50, o51, o52, o53, o60, o61, o62, o63, o70, o71, o72, o73,
        ) = _step_max(
            m0, m1, l0, l1, tl.maximum(s0, s2), tl.maximum(s1, s3), o00, o01, o02, o03, o10, o11, o12, o13,
            o20, o21, o22, o23, o30, o31, o32, o33, o40, o41, o42, o43, o50, o51, o52, o53, o60, o61, o62,
            o63, o70, o71, o72, o73,
        )  # fmt: skip
        p0, p1 = tl.exp2(s0 - c0), tl.exp2(s1 - c1)
        p2, p3 = tl.exp2(s2 - c0), tl.exp2(s3 - c1)
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
        x0, x1, x2, x3, x4, x5, x6, x7 = _ld16(xp + 16 * g, mx)
        y0, y1, y2, y3, y4, y5, y6, y7 = _ld16(yp + 16 * g, my)
        u0, u1, u2, u3, u4, u5, u6, u7 = _ld16(up + 16 * g, mu)
        w0, w1, w2, w3, w4, w5, w6, w7 = _ld16(wp + 16 * g, mw)
        # m-tile 2j: dims 4j, 4j + 2 (low halves of words 2j, 2j + 1); m-tile 2j + 1: dims 4j + 1, 4j + 3
        o00, o01, o02, o03 = _mma_bf16(_lo(x0, y0), _lo(x1, y1), _lo(u0, w0), _lo(u1, w1), pa, pb, o00, o01, o02, o03)
        o10, o11, o12, o13 = _mma_bf16(_hi(x0, y0), _hi(x1, y1), _hi(u0, w0), _hi(u1, w1), pa, pb, o10, o11, o12, o13)
        o20, o21, o22, o23 = _mma_bf16(_lo(x2, y2), _lo(x3, y3), _lo(u2, w2), _lo(u3, w3), pa, pb, o20, o21, o22, o23)
        o30, o31, o32, o33 = _mma_bf16(_hi(x2, y2), _hi(x3, y3), _hi(u2, w2), _hi(u3, w3), pa, pb, o30, o31, o32, o33)
        o40, o41, o42, o43 = _mma_bf16(_lo(x4, y4), _lo(x5, y5), _lo(u4, w4), _lo(u5, w5), pa, pb, o40, o41, o42, o43)
        o50, o51, o52, o53 = _mma_bf16(_hi(x4, y4), _hi(x5, y5), _hi(u4, w4), _hi(u5, w5), pa, pb, o50, o51, o52, o53)
        o60, o61, o62, o63 = _mma_bf16(_lo(x6, y6), _lo(x7, y7), _lo(u6, w6), _lo(u7, w7), pa, pb, o60, o61, o62, o63)
        o70, o71, o72, o73 = _mma_bf16(_hi(x6, y6), _hi(x7, y7), _hi(u6, w6), _hi(u7, w7), pa, pb, o70, o71, o72, o73)
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
    kernel made the whole kernel 255 registers with ~1 KB of spills (sm_90, 2026-11-30) against 128 and
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


@triton.jit
def mma_chunk(n, num_splits, MINC: tl.constexpr):
    """Tokens per split of a ``n``-token context (16-token tiles, >= ``MINC``); shared with the combine step."""
    return tl.maximum(tl.cdiv(tl.cdiv(n, num_splits), 16) * 16, MINC)


@triton.jit
def dyn_splits(act, max_splits, warp_slots, warps_per_req, reserve_per_req):
    """Splits per (request, KV head) when ``act`` requests are real: ``warp_slots`` one-warp programs, less
    ``reserve_per_req`` per request (variant option ``tw``: the tail programs), shared out in splits of
    ``warps_per_req`` (rounded down: whole waves), at least 1, at most ``max_splits`` (the grid's). NOTE: the
    host twin is ``decode_config.mma_num_splits``; the combine step calls this one with the same arguments."""
    a = tl.maximum(act, 1)
    return tl.maximum(1, tl.minimum(max_splits, (warp_slots - a * reserve_per_req) // (a * warps_per_req)))


@triton.jit
def _fixup_mma(cnt_ptr, o_ptr, lse_ptr, lens_ptr, out_ptr, s_ob, s_oh, lse_out, b, h, S_TOT, TAIL_SLOTS,
               splits, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, NW: tl.constexpr,
               MINC: tl.constexpr, TAIL_MMA: tl.constexpr, WRITE_LSE: tl.constexpr, PAIR: tl.constexpr):  # fmt: skip
    """``decode_fixup.fixup`` for decode_mma: ``splits`` (the run's, ``dyn_splits`` with ``DYN``) + the tail's
    programs per pair; the written slots are the first ``cdiv(rows, chunk) * NW`` (twice that with ``PAIR``:
    one per token parity, ``D`` = the real head_dim) and the tail's."""
    rows = (tl.load(lens_ptr + b) + PAIR) // (1 + PAIR)
    n_first = tl.cdiv(rows, mma_chunk(rows, splits, MINC)) * NW * (1 + PAIR)
    fixup(cnt_ptr + b * (HQ // G) + h, splits + TAIL_MMA, o_ptr, lse_ptr, S_TOT, n_first, TAIL_SLOTS,
          out_ptr, s_ob, s_oh, lse_out, b, h, HQ, G, D, 16, WRITE_LSE)  # fmt: skip


@triton.jit
def _zero_rows(out_ptr, s_ob, s_oh, lse_out, b, h, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
               WRITE_LSE: tl.constexpr):  # fmt: skip
    """A padding pair's output rows (and lse: -inf) with ``FUSE`` under ``DYN``, as the combine step leaves
    them (no tokens: zeros)."""
    offs = tl.arange(0, D)
    for g in tl.static_range(G):
        hq = h * G + g
        tl.store(out_ptr + b.to(tl.int64) * s_ob + hq * s_oh + offs, tl.zeros([D], out_ptr.dtype.element_ty))
        if WRITE_LSE:
            tl.store(lse_out + b.to(tl.int64) * HQ + hq, float("-inf"))


@triton.jit
def decode_mma_kernel(
    q_ptr, s_qb, s_qh,
    k_ptr, v_ptr, ks_ptr, vs_ptr, g_ptr,
    s_page, s_head, s_tok, sc_page, sc_head, sc_tok,
    pt_ptr, s_pt, lens_ptr,
    tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr,
    o_ptr, lse_ptr, sm_scale,
    HQ: tl.constexpr, G: tl.constexpr, BH: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, TPAGE: tl.constexpr, BN: tl.constexpr, TBN: tl.constexpr,
    NUM_SPLITS, HAS_TAIL: tl.constexpr, FMT: tl.constexpr, INTERP: tl.constexpr, NW: tl.constexpr,
    TPI: tl.constexpr = 1, PF: tl.constexpr = 1, MINC: tl.constexpr = 16, PAIR: tl.constexpr = 0,
    VST: tl.constexpr = 0, VQ: tl.constexpr = 0, TAIL_MMA: tl.constexpr = 0,
    act_ptr=None, warp_slots=0, reserve_per_req=0, DYN: tl.constexpr = 0,
    TPP: tl.constexpr = 0,
    cnt_ptr=None, out_ptr=None, s_ob=0, s_oh=0, lse_out=None, FUSE: tl.constexpr = 0, WRITE_LSE: tl.constexpr = 0,
    TMA: tl.constexpr = 0, tma_scratch=None, PDL: tl.constexpr = 0, LZ: tl.constexpr = 0,
    L2: tl.constexpr = 0, qr_ptr=None, s_qt=0, s_qr=0, qcu_ptr=None, q_last=0, QG: tl.constexpr = 0,
    QNG: tl.constexpr = 1,
):  # fmt: skip
    """``decode._decode_kernel``'s arguments (the tail ones used with ``TAIL_MMA``); grid ``(B, kv_heads, NUM_SPLITS)``, ``NW``
    warps. ``PAIR``: a head_dim-64 pool viewed as head_dim ``D`` = 128 with two tokens a row (``PAGE`` =
    rows per page, ``lens`` still in tokens; see ``_mma_segment``): twice the slots, ``D / 2`` dims each.

    Partial slots per head: ``NUM_SPLITS * NW`` (split ``sp``, warp ``w`` -> slot ``sp * NW + w``), then with
    ``HAS_TAIL`` the tail's slots: with ``TAIL_MMA`` > 0 the grid has that many more splits ``sp >=
    NUM_SPLITS``, one-warp programs each attending whole 16-row tiles of the tail into a slot of their own
    (two with ``PAIR``: one per parity), else one slot written by :func:`decode_tail_kernel` (its own
    launch). ``BN`` is
    unused here (tiles are 16 tokens); ``s_tok``/``sc_tok`` must be ``D / 2`` / ``D / 16`` (checked by the
    launcher).

    ``DYN`` (CUDA graphs replayed with padding rows): a 1-D grid of ``B * kv_heads * (NUM_SPLITS +
    TAIL_MMA)`` programs; only the first ``*act_ptr`` requests are real, and they get ``dyn_splits``
    (<= ``NUM_SPLITS``) splits each -- programs ``[0, act * kv_heads * splits)`` in (request, head, split)
    order, so the one wave holds only real work; the tail programs come after all split slots.
    ``TPP``: the tail program prefetches each next tile's page id (``_mma_tail``).
    ``TMA``: tiles staged through shared memory (``_mma_segment``); ``tma_scratch`` = the interpreter's rings,
    ``TMA`` stages per program in grid order (``_tma.tma_ring``).

    ``L2``: ``decode_mma16``'s L2 prefetch distance in steps (variant option ``l2``; 0 = off).
    ``QG`` > 0 (``decode_mma16`` only): Q rows from ``qr_ptr`` (``q [T, Hq, D]``, strides ``s_qt`` /
    ``s_qr``) through ``decode_triton``'s ``q_rows`` map -- request ``b`` is virtual: real request ``b //
    QNG`` (its first token ``qcu_ptr[b // QNG]``), columns from ``(b % QNG) * G``; ``q_ptr`` is unused.

    ``FUSE``: every program of a real pair, empty splits too, draws a ticket and the
    pair's last one merges its partials into ``out_ptr`` (``decode_fixup``); no combine launch. With ``DYN``
    the spare programs zero the padding rows.
    """
    pdl_enter(PDL)
    HKV: tl.constexpr = HQ // G
    TM1: tl.constexpr = TAIL_MMA if TAIL_MMA > 0 else 1
    if DYN:
        pid = tl.program_id(0)
        act = tl.load(act_ptr)
        s_run = dyn_splits(act, NUM_SPLITS, warp_slots, HKV * NW, reserve_per_req)
        grid_main = tl.num_programs(0) - TAIL_MMA * (tl.num_programs(0) // (NUM_SPLITS + TAIL_MMA))
        if (pid >= act * HKV * s_run) & (pid < grid_main):
            if FUSE:  # NOTE: the spare programs (>= one per padding pair) zero the padding rows' outputs
                pad = act * HKV + pid - act * HKV * s_run
                if pad < grid_main // NUM_SPLITS:
                    _zero_rows(out_ptr, s_ob, s_oh, lse_out, pad // HKV, pad % HKV, HQ, G, D // (1 + PAIR),
                               WRITE_LSE)  # fmt: skip
            return
        tail_prog = pid >= grid_main
        pair = tl.where(tail_prog, (pid - grid_main) // TM1, pid // s_run)
        sp = tl.where(tail_prog, NUM_SPLITS + (pid - grid_main) % TM1, pid % s_run)
        b = pair // HKV
        h = pair % HKV
        if b >= act:
            return
    else:
        b = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        s_run = NUM_SPLITS
    # NOTE: mirrored by decode.mma_tail_slots
    TAIL_SLOTS: tl.constexpr = HAS_TAIL * (TAIL_MMA * (1 + PAIR) if TAIL_MMA > 0 else 1)
    S_TOT = NUM_SPLITS * NW * (1 + PAIR) + TAIL_SLOTS
    DO: tl.constexpr = D // (1 + PAIR)
    q_base = q_ptr + b.to(tl.int64) * s_qb
    if TAIL_MMA:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
        if sp >= NUM_SPLITS:
            part = sp - NUM_SPLITS
            tail_first = (b.to(tl.int64) * HQ + h * G) * S_TOT + S_TOT - TAIL_SLOTS + part * (1 + PAIR)
            _mma_tail(
                q_base, s_qh, tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr + b.to(tl.int64) * s_tpt,
                tl.load(tlens_ptr + b), h, sm_scale * 1.4426950408889634, o_ptr + tail_first * DO,
                lse_ptr + tail_first, S_TOT * DO, G, D, TPAGE, VST, PAIR, TPP, part, TAIL_MMA,
            )  # fmt: skip
            if FUSE:
                _fixup_mma(cnt_ptr, o_ptr, lse_ptr, lens_ptr, out_ptr, s_ob, s_oh, lse_out, b, h, S_TOT, TAIL_SLOTS,
                           s_run, HQ, G, DO, NW, MINC, TAIL_MMA, WRITE_LSE, PAIR)  # fmt: skip
            return
    first = (b.to(tl.int64) * HQ + h * G) * S_TOT + sp * NW * (1 + PAIR)
    n = tl.load(lens_ptr + b)
    rows = (n + PAIR) // (1 + PAIR)
    # NOTE: splits are fixed per batch size (CUDA graphs); at least MINC tokens each keeps a short
    # context from spreading one tile per warp over all of them (the later splits stay empty)
    chunk = mma_chunk(rows, s_run, MINC)
    start = sp * chunk
    if start >= rows:  # NOTE: writes nothing; the combine step reads only the first cdiv(rows, chunk) splits
        if FUSE:
            _fixup_mma(cnt_ptr, o_ptr, lse_ptr, lens_ptr, out_ptr, s_ob, s_oh, lse_out, b, h, S_TOT, TAIL_SLOTS,
                       s_run, HQ, G, DO, NW, MINC, TAIL_MMA, WRITE_LSE, PAIR)  # fmt: skip
        return
    end = tl.minimum(start + chunk, rows)
    end1 = end
    if PAIR:
        end1 = tl.minimum(end, n // 2)  # an odd count: the last row's second token is not there
    # the decoded codes are value * 2**-14: fold that and the global scales into the fp32 factors
    gk = tl.load(g_ptr) * 16384.0
    gv = tl.load(g_ptr + 1) * 16384.0
    scratch = tma_scratch
    if TMA:
        if DYN:
            lin = tl.program_id(0)
        else:
            lin = (b * tl.num_programs(1) + h) * tl.num_programs(2) + sp
        scratch = tma_ring(tma_scratch, lin, TMA)
    if G > 8:  # 9-16 columns: one S = Q K^T warp (decode_mma16)
        qtok0 = 0
        if QG > 0:
            q_base = qr_ptr
            s_qh = s_qr
            qtok0 = tl.load(qcu_ptr + b // QNG)
        _mma16_segment(
            q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
            pt_ptr + b.to(tl.int64) * s_pt, start, end, end1, h, sm_scale * 1.4426950408889634 * gk, gv,
            o_ptr + first * DO, lse_ptr + first, S_TOT * DO,
            G, D, PAGE, NW, TPI, PF, PAIR, VST, VQ, TMA, scratch, LZ, L2,
            qtok0, (b % QNG) * G, s_qt, q_last, QG,
        )  # fmt: skip
    else:
        _mma_segment(
            q_base, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page, sc_head,
            pt_ptr + b.to(tl.int64) * s_pt, start, end, end1, h, sm_scale * 1.4426950408889634 * gk, gv,
            o_ptr + first * DO, lse_ptr + first, S_TOT * DO,
            G, D, PAGE, NW, TPI, PF, PAIR, VST, VQ, TMA, scratch, LZ, L2,
        )  # fmt: skip
    if FUSE:
        _fixup_mma(cnt_ptr, o_ptr, lse_ptr, lens_ptr, out_ptr, s_ob, s_oh, lse_out, b, h, S_TOT, TAIL_SLOTS,
                   s_run, HQ, G, DO, NW, MINC, TAIL_MMA, WRITE_LSE, PAIR)  # fmt: skip
