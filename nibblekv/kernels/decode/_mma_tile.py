"""Fragments of one 16-token NVFP4 tile and of Q for the hand-placed ``mma.sync`` decode kernels.

Shared by ``decode_mma`` (8 query columns a KV head: ``S^T = K Q^T``) and ``decode_mma16`` (16 columns:
``S = Q K^T``): both use the same converted registers -- a key row's A-fragment registers for ``S^T`` are,
unchanged, its B-fragment registers for ``S`` (and likewise V's), see ``decode_mma16``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.ptx.mma import (
    _bcast_h2,
    _cvt_word_sm,
    _ld4,
    _pack_h2,
    _page_addr,
    _pair_halves,
    _prefetch_l2,
    _prefetch_l2_bulk,
    _scale_h2,
    _split64,
)


# ----------------------------------------------------------------------------------------------------
# fragments of one 16-token tile
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _k_row(lo, hi, sc):
    """Key row bytes ``[16t, 16t + 16)`` (two uint64 = blocks 2t, 2t+1) + their 2 scale bytes -> 16 half2.

    Output ``2 * kk + j`` is this row's A-fragment register for k-step ``kk`` (j = 0: cols 2t..2t+1,
    j = 1: cols 2t+8..2t+9): word ``kk // 2``, even ``kk`` its even elements, odd ``kk`` its odd ones.
    """
    w0, w1 = _split64(lo)
    w2, w3 = _split64(hi)
    sa, sb = _bcast_h2(_scale_h2(sc))
    a0, a1, a2, a3 = _cvt_word_sm(w0, sa)
    b0, b1, b2, b3 = _cvt_word_sm(w1, sa)
    c0, c1, c2, c3 = _cvt_word_sm(w2, sb)
    d0, d1, d2, d3 = _cvt_word_sm(w3, sb)
    return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3


@triton.jit
def _v_pair(x, y, sc):
    """Block ``g`` (uint64) of two tokens + their block scales (2 bytes) -> 16 half2 (token x, token y).

    Output ``i`` holds dim ``16g + [0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15][i]``; m-tile
    ``mt`` takes outputs ``2mt`` (fragment row g) and ``2mt + 1`` (row g + 8).
    """
    x0, x1 = _split64(x)
    y0, y1 = _split64(y)
    s = _scale_h2(sc)
    # sm order: the low halves hold (e0, e4, e1, e5), the high ones (e2, e6, e3, e7)
    p, q = _pair_halves(x0, y0)
    a0, b0, a2, b2 = _cvt_word_sm(p, s)
    a1, b1, a3, b3 = _cvt_word_sm(q, s)
    p, q = _pair_halves(x1, y1)
    c0, d0, c2, d2 = _cvt_word_sm(p, s)
    c1, d1, c3, d3 = _cvt_word_sm(q, s)
    return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3


@triton.jit
def _tile_regs(raw, V: tl.constexpr):
    """``_load_tile``'s key rows g, g + 8 (``V`` = 0: ``_k_row``) or value rows (1: ``_v_pair`` of tokens
    (2t, 2t+1), then of (2t+8, 2t+9)) -> their 16 + 16 converted registers."""
    if V:
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _v_pair(raw[6], raw[7], raw[10])
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = _v_pair(raw[8], raw[9], raw[11])
    else:
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15 = _k_row(raw[0], raw[1], raw[4])
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15 = _k_row(raw[2], raw[3], raw[5])
    return (
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15,
    )  # fmt: skip


@triton.jit
def _row_base(pt_ptr, idx, lim, s_page, sc_page, PAGE: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr):
    """Token index -> (data byte offset, scale byte offset, valid) of its row (head offsets not added)."""
    valid = idx < lim
    if MASKED:  # NOTE: mask the page-table read too (masked-off tokens may lie past the table)
        page = tl.load(pt_ptr + idx // PAGE, mask=valid, other=0).to(tl.int64)
    else:
        page = tl.load(pt_ptr + idx // PAGE).to(tl.int64)
    tok = (idx % PAGE).to(tl.int64)
    return page * s_page + tok * (D // 2), page * sc_page + tok * (D // 16), valid


@triton.jit
def _page_id(pt_ptr, idx, lim, PAGE: tl.constexpr, MASKED: tl.constexpr):
    """The page id (int32) of token row ``idx``; 0 past ``lim`` if ``MASKED`` (the table may end there)."""
    if MASKED:
        return tl.load(pt_ptr + idx // PAGE, mask=idx < lim, other=0).to(tl.int32)
    return tl.load(pt_ptr + idx // PAGE).to(tl.int32)


@triton.jit
def _l2_pages(pt_ptr, n0, ahead, full_end, lane, warp, TPI: tl.constexpr, PAGE: tl.constexpr):
    """The page ids this lane's two ``_l2_prefetch`` lines lie on (pages of 16 rows), for this warp's tiles
    of the step ``ahead`` tokens past the step at ``n0`` (past the last full step: the one at ``n0``
    again): (data line, scale line)."""
    la = n0 + ahead
    nb = tl.where(la < full_end, la, n0) + 16 * TPI * warp
    L = lane % 32
    pd = tl.load(pt_ptr + (nb + 16 * (L // 16)) // PAGE, mask=L < 16 * TPI, other=0).to(tl.int32)
    ps = tl.load(pt_ptr + (nb + 16 * ((L // 4) % 2)) // PAGE, mask=L < 4 * TPI, other=0).to(tl.int32)
    return pd, ps


@triton.jit
def _l2_prefetch(k64, v64, ks16, vs8, pages, hoff, shoff, s_page, sc_page, lane,
                 TPI: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, L2B: tl.constexpr = 0):  # fmt: skip
    """L2 prefetch of a step's tiles (16-row pages: a tile is one page of one KV head), two per-lane
    instructions: data lane ``16 i + 8 kv + l`` takes 128-byte line ``l`` of tile ``i``'s K (kv = 0) or V
    rows; scale lane ``4 i + 2 kv`` tile ``i``'s K or V scale bytes (16 x D / 16 bytes, one line).
    ``pages`` = ``_l2_pages``. NOTE: 16 rows x D / 2 bytes = 8 lines at D = 128.
    ``L2B`` > 0 (``DecodeConfig.l2_bulk``; the pool's (page, KV head) run of that many bytes: K rows, K
    scales, V rows, V scales): lane ``16 i`` prefetches tile ``i``'s whole run as one bulk copy instead."""
    tl.static_assert(D == 128 and PAGE == 16, "8 lines of 128 bytes a tile, one page a tile")
    pd, ps = pages
    L = lane % 32
    if L2B > 0:
        run = _page_addr(pd, s_page, (k64 + (hoff >> 3)).to(tl.int64))
        return _prefetch_l2_bulk(run, (L * 0 + L2B).to(tl.int32), (L % 16 == 0) & (L < 16 * TPI))
    kv = (L // 8) % 2
    dbase = tl.where(kv == 0, (k64 + (hoff >> 3)).to(tl.int64), (v64 + (hoff >> 3)).to(tl.int64))
    a = _prefetch_l2(_page_addr(pd, s_page, dbase + (L % 8) * 128), L < 16 * TPI)
    skv = (L // 2) % 2
    sbase = tl.where(skv == 0, (ks16 + (shoff >> 1)).to(tl.int64), (vs8 + shoff).to(tl.int64))
    return a + _prefetch_l2(_page_addr(ps, sc_page, sbase), (L < 4 * TPI) & (L % 2 == 0))


@triton.jit
def _load_tile(k64, v64, ks16, vs8, pt_ptr, n0, lim, lim1, hoff, shoff, s_page, sc_page, g, t,
               PAGE: tl.constexpr, D: tl.constexpr, MASKED: tl.constexpr,
               PAIR: tl.constexpr = 0):  # fmt: skip
    """This lane's raw bytes of the tile at ``n0`` (per lane): K rows g, g+8; V rows 2t, 2t+1, 2t+8, 2t+9.

    Returns 4 K uint64, 2 K scale pairs, 4 V uint64, 2 V scale pairs (uint32); masked rows read as 0.
    With ``PAIR`` a row is two tokens (see ``_mma_segment``): bytes of the second one (K blocks 4-7, i.e.
    lanes ``t >= 2``; V block ``g >= 4``) are masked against ``lim1``.
    NOTE: data offsets are in bytes, divided by 8 (2) for the uint64 (uint16) views; the launcher checks
    that pages and heads are aligned for that.
    """
    R8: tl.constexpr = D // 16  # uint64 words per row (D/2 bytes); also scale bytes per row
    klim = lim
    vlim = lim
    if PAIR:
        klim = tl.where(t >= 2, lim1, lim)
        vlim = tl.where(g >= 4, lim1, lim)
    if PAGE % 16 == 0 or PAGE == 8:  # tiles start at multiples of 16 rows: one page, or two of 8 rows
        if PAGE <= 16:
            # NOTE: tiles start at multiples of 16 rows (mma_chunk, decode_balanced's t0 * 16), so at a page's
            # first row: each pointer is a loop-invariant lane base + page id * page stride (_page_addr)
            kb = (k64 + (hoff >> 3) + (g * R8 + 2 * t)).to(tl.int64)
            vb = (v64 + (hoff >> 3) + (2 * t * R8 + g)).to(tl.int64)
            ksb = (ks16 + (shoff >> 1) + (g * (R8 // 2) + t)).to(tl.int64)
            vsb = (vs8 + shoff + (2 * t * R8 + g)).to(tl.int64)
            p0 = _page_id(pt_ptr, n0, lim, PAGE, MASKED)
            kp = _page_addr(p0, s_page, kb).to(tl.pointer_type(tl.uint64))
            vp = _page_addr(p0, s_page, vb).to(tl.pointer_type(tl.uint64))
            ksp = _page_addr(p0, sc_page, ksb).to(tl.pointer_type(tl.uint16))
            vsp = _page_addr(p0, sc_page, vsb).to(tl.pointer_type(tl.uint8))
        else:  # a tile inside a longer page: its row offset too
            d0, s0, _ = _row_base(pt_ptr, n0, lim, s_page, sc_page, PAGE, D, MASKED)
            kp = k64 + ((d0 + hoff) >> 3) + (g * R8 + 2 * t)
            vp = v64 + ((d0 + hoff) >> 3) + (2 * t * R8 + g)
            ksp = ks16 + ((s0 + shoff) >> 1) + (g * (R8 // 2) + t)
            vsp = vs8 + (s0 + shoff) + (2 * t * R8 + g)
        if PAGE == 8:  # rows 8-15 on the next page
            p1 = _page_id(pt_ptr, n0 + 8, lim, PAGE, MASKED)
            kp8 = _page_addr(p1, s_page, kb).to(tl.pointer_type(tl.uint64))
            vpc = _page_addr(p1, s_page, vb).to(tl.pointer_type(tl.uint64))
            ksp8 = _page_addr(p1, sc_page, ksb).to(tl.pointer_type(tl.uint16))
            vspc = _page_addr(p1, sc_page, vsb).to(tl.pointer_type(tl.uint8))
            vpb, vpd = vp + R8, vpc + R8
            vspb, vspd = vsp + R8, vspc + R8
        else:
            kp8, ksp8 = kp + 8 * R8, ksp + 4 * R8
            vpb, vpc, vpd = vp + R8, vp + 8 * R8, vp + 9 * R8
            vspb, vspc, vspd = vsp + R8, vsp + 8 * R8, vsp + 9 * R8
        mg, m8, ma = n0 + g < klim, n0 + g + 8 < klim, n0 + 2 * t < vlim
        mb, mc, md = n0 + 2 * t + 1 < vlim, n0 + 2 * t + 8 < vlim, n0 + 2 * t + 9 < vlim
    else:
        dg, sg, mg = _row_base(pt_ptr, n0 + g, lim, s_page, sc_page, PAGE, D, MASKED)
        d8, s8, m8 = _row_base(pt_ptr, n0 + g + 8, lim, s_page, sc_page, PAGE, D, MASKED)
        da, sa, ma = _row_base(pt_ptr, n0 + 2 * t, lim, s_page, sc_page, PAGE, D, MASKED)
        db, sb, mb = _row_base(pt_ptr, n0 + 2 * t + 1, lim, s_page, sc_page, PAGE, D, MASKED)
        dc, sc, mc = _row_base(pt_ptr, n0 + 2 * t + 8, lim, s_page, sc_page, PAGE, D, MASKED)
        dd, sd, md = _row_base(pt_ptr, n0 + 2 * t + 9, lim, s_page, sc_page, PAGE, D, MASKED)
        if PAIR:
            mg, m8 = n0 + g < klim, n0 + g + 8 < klim
            ma, mb = n0 + 2 * t < vlim, n0 + 2 * t + 1 < vlim
            mc, md = n0 + 2 * t + 8 < vlim, n0 + 2 * t + 9 < vlim
        kp, kp8 = k64 + ((dg + hoff) >> 3) + 2 * t, k64 + ((d8 + hoff) >> 3) + 2 * t
        ksp, ksp8 = ks16 + ((sg + shoff) >> 1) + t, ks16 + ((s8 + shoff) >> 1) + t
        vp, vpb = v64 + ((da + hoff) >> 3) + g, v64 + ((db + hoff) >> 3) + g
        vpc, vpd = v64 + ((dc + hoff) >> 3) + g, v64 + ((dd + hoff) >> 3) + g
        vsp, vspb, vspc, vspd = (
            vs8 + sa + shoff + g,
            vs8 + sb + shoff + g,
            vs8 + sc + shoff + g,
            vs8 + sd + shoff + g,
        )
    if MASKED:
        kg0 = tl.load(kp, mask=mg, other=0)
        kg1 = tl.load(kp + 1, mask=mg, other=0)
        k80 = tl.load(kp8, mask=m8, other=0)
        k81 = tl.load(kp8 + 1, mask=m8, other=0)
        ksg = tl.load(ksp, mask=mg, other=0).to(tl.uint32)
        ks8 = tl.load(ksp8, mask=m8, other=0).to(tl.uint32)
        va = tl.load(vp, mask=ma, other=0)
        vb = tl.load(vpb, mask=mb, other=0)
        vc = tl.load(vpc, mask=mc, other=0)
        vd = tl.load(vpd, mask=md, other=0)
        sva = tl.load(vsp, mask=ma, other=0).to(tl.uint32)
        svb = tl.load(vspb, mask=mb, other=0).to(tl.uint32)
        svc = tl.load(vspc, mask=mc, other=0).to(tl.uint32)
        svd = tl.load(vspd, mask=md, other=0).to(tl.uint32)
    else:
        kg0 = tl.load(kp)
        kg1 = tl.load(kp + 1)
        k80 = tl.load(kp8)
        k81 = tl.load(kp8 + 1)
        ksg = tl.load(ksp).to(tl.uint32)
        ks8 = tl.load(ksp8).to(tl.uint32)
        va = tl.load(vp)
        vb = tl.load(vpb)
        vc = tl.load(vpc)
        vd = tl.load(vpd)
        sva = tl.load(vsp).to(tl.uint32)
        svb = tl.load(vspb).to(tl.uint32)
        svc = tl.load(vspc).to(tl.uint32)
        svd = tl.load(vspd).to(tl.uint32)
    return kg0, kg1, k80, k81, ksg, ks8, va, vb, vc, vd, sva | (svb << 8), svc | (svd << 8)


@triton.jit
def _softmax(m0, m1, l0, l1, x0, x1):
    """New running max ``n0/n1`` from the tiles' column max ``x0/x1``; returns (n0, n1, c0, c1, al0, al1).

    ``c`` is the max to subtract: NOTE a warp's masked tile may hold no valid token (max -inf), then 0.
    """
    n0 = tl.maximum(m0, x0)
    n1 = tl.maximum(m1, x1)
    c0 = tl.where(n0 > float("-inf"), n0, 0.0)
    c1 = tl.where(n1 > float("-inf"), n1, 0.0)
    return n0, n1, c0, c1, tl.exp2(m0 - c0), tl.exp2(m1 - c1)


@triton.jit
def _online_init(N: tl.constexpr):
    """A fresh online softmax over ``N`` lanes: maxima -inf (m0, m1), sums 0 (l0, l1), and the zero that the
    O^T accumulators start from."""
    m0 = tl.full([N], float("-inf"), tl.float32)
    z = tl.zeros([N], tl.float32)
    return m0, m0, z, z, z


@triton.jit
def _q_pair(qrow, d, qm):
    """half2 (Q[d], Q[d + 2]) of this lane's head (zeros past the GQA group)."""
    a = tl.load(qrow + d, mask=qm, other=0.0).to(tl.float32)
    b = tl.load(qrow + d + 2, mask=qm, other=0.0).to(tl.float32)
    return _pack_h2(a, b)


@triton.jit
def _bf16_lo(w):
    """The low bf16 of a uint32 -> fp32 (exact)."""
    return (w << 16).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_hi(w):
    """The high bf16 of a uint32 -> fp32 (exact)."""
    return ((w >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _q_frags_vec(qrow, qm):
    """``_q_pair``'s 16 B-fragments from 4 vector loads of bf16 Q dims ``[0, 32)`` at ``qrow`` (word ``k`` =
    dims ``2k, 2k + 1``): fragment ``i`` = (Q[o], Q[o + 2]), o = ``[0, 4, 1, 5, 8, 12, 9, 13, ...][i]``."""
    w0, w1, w2, w3 = _ld4(qrow, qm)
    w4, w5, w6, w7 = _ld4(qrow + 8, qm)
    w8, w9, w10, w11 = _ld4(qrow + 16, qm)
    w12, w13, w14, w15 = _ld4(qrow + 24, qm)
    return (
        _pack_h2(_bf16_lo(w0), _bf16_lo(w1)), _pack_h2(_bf16_lo(w2), _bf16_lo(w3)),
        _pack_h2(_bf16_hi(w0), _bf16_hi(w1)), _pack_h2(_bf16_hi(w2), _bf16_hi(w3)),
        _pack_h2(_bf16_lo(w4), _bf16_lo(w5)), _pack_h2(_bf16_lo(w6), _bf16_lo(w7)),
        _pack_h2(_bf16_hi(w4), _bf16_hi(w5)), _pack_h2(_bf16_hi(w6), _bf16_hi(w7)),
        _pack_h2(_bf16_lo(w8), _bf16_lo(w9)), _pack_h2(_bf16_lo(w10), _bf16_lo(w11)),
        _pack_h2(_bf16_hi(w8), _bf16_hi(w9)), _pack_h2(_bf16_hi(w10), _bf16_hi(w11)),
        _pack_h2(_bf16_lo(w12), _bf16_lo(w13)), _pack_h2(_bf16_lo(w14), _bf16_lo(w15)),
        _pack_h2(_bf16_hi(w12), _bf16_hi(w13)), _pack_h2(_bf16_hi(w14), _bf16_hi(w15)),
    )  # fmt: skip


@triton.jit
def _q_frags(qrow, qm, VQ: tl.constexpr):
    """One head's 16 Q fragment registers for the lane's dims ``[32t, 32t + 32)`` at ``qrow`` (already
    offset by ``32t``; zeros where not ``qm``): ``decode_mma``'s B operand, ``decode_mma16``'s A operand.
    ``VQ``: 4 vector loads (bf16 rows 16-byte aligned) instead of 32 scattered ones."""
    if VQ:
        return _q_frags_vec(qrow, qm)
    return (
        _q_pair(qrow, 0, qm), _q_pair(qrow, 4, qm), _q_pair(qrow, 1, qm), _q_pair(qrow, 5, qm),
        _q_pair(qrow, 8, qm), _q_pair(qrow, 12, qm), _q_pair(qrow, 9, qm), _q_pair(qrow, 13, qm),
        _q_pair(qrow, 16, qm), _q_pair(qrow, 20, qm), _q_pair(qrow, 17, qm), _q_pair(qrow, 21, qm),
        _q_pair(qrow, 24, qm), _q_pair(qrow, 28, qm), _q_pair(qrow, 25, qm), _q_pair(qrow, 29, qm),
    )  # fmt: skip


@triton.jit
def _warp_lanes(k_ptr, v_ptr, ks_ptr, vs_ptr, h, s_head, sc_head, NW: tl.constexpr):
    """A segment's lane coordinates and pool views: lane, warp, fragment row ``g`` and column ``t``, K / V as
    64-bit words, the E4M3 scale bytes (K's read as 16-bit pairs, raw bits) and head ``h``'s data and scale
    offsets. Shared by the NVFP4 ``mma.sync`` segments (``decode_mma``, ``decode_mma16``, head_dim 256)."""
    lane = tl.arange(0, 32 * NW)
    warp = lane // 32
    g = (lane % 32) // 4
    t = lane % 4
    k64 = k_ptr.to(tl.pointer_type(tl.uint64))
    v64 = v_ptr.to(tl.pointer_type(tl.uint64))
    ks16 = ks_ptr.to(tl.pointer_type(tl.uint16))
    vs8 = vs_ptr.to(tl.pointer_type(tl.uint8))
    hoff = h.to(tl.int64) * s_head
    shoff = h.to(tl.int64) * sc_head
    return lane, warp, g, t, k64, v64, ks16, vs8, hoff, shoff
