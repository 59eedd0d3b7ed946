"""The shared-memory ring of ``DecodeConfig.smem_stages`` for the head_dim-128 / 256 ``mma.sync`` segments: which
step's (page, KV head) runs go into which stage (``_ring_start``, ``_ring_next``) and each lane's raw words of a
tile read back from a stage (``_ring_tile``: ``_mma_tile._load_tile``'s words). The PTX (bulk copies,
mbarriers, ``ld.shared``) and its interpreter twins are ``ptx.ring``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels.ptx.mma import _page_addr
from nibblekv.kernels.ptx.ring import (
    STAGE_BYTES,
    _lds64,
    _lds128,
    _lds_narrow,
    _mbar_init,
    _mbar_inval,
    _ring_alloc,
    _ring_issue,
    _ring_wait,
)

_STAGE = tl.constexpr(STAGE_BYTES)


@triton.jit
def _ring_tile(base, g, t, D: tl.constexpr, HALF: tl.constexpr = 0):
    """``_load_tile``'s raw words (unmasked) from a tile's (page, KV head) run at ``base`` (shared; the
    global run under the interpreter): K rows, K scales, V rows, V scales, 16 rows each. ``HALF`` = 1: the
    high 128 dims of a head_dim-256 row (64 data and 8 scale bytes further)."""
    RB: tl.constexpr = D // 2  # data bytes a row
    SB: tl.constexpr = D // 16  # scale bytes a row
    KS: tl.constexpr = 16 * RB
    V: tl.constexpr = 16 * (RB + SB)
    kb = base + HALF * 64 + 16 * t
    kg0, kg1 = _lds128(kb + g * RB)
    k80, k81 = _lds128(kb + (g + 8) * RB)
    ksb = base + KS + HALF * 8 + 2 * t
    ksg = _lds_narrow(ksb + g * SB, 2)
    ks8 = _lds_narrow(ksb + (g + 8) * SB, 2)
    vb = base + V + HALF * 64 + 8 * g + 2 * t * RB
    va = _lds64(vb)
    vb1 = _lds64(vb + RB)
    vc = _lds64(vb + 8 * RB)
    vd = _lds64(vb + 9 * RB)
    vsb = base + V + KS + HALF * 8 + g + 2 * t * SB
    sva = _lds_narrow(vsb, 1)
    svb = _lds_narrow(vsb + SB, 1)
    svc = _lds_narrow(vsb + 8 * SB, 1)
    svd = _lds_narrow(vsb + 9 * SB, 1)
    return kg0, kg1, k80, k81, ksg, ks8, va, vb1, vc, vd, sva | (svb << 8), svc | (svd << 8)


@triton.jit
def _ring_open(lane, S: tl.constexpr):
    """This program's ring of ``S`` stages with its mbarriers initialized: (stage 0's address, the first
    mbarrier's; mbarrier ``s`` at ``+ 8 s``)."""
    ring = _ring_alloc(lane.to(tl.int32), S)
    bars = ring + S * _STAGE
    for s in tl.static_range(S):
        _mbar_init(bars + 8 * s, lane)
    return ring, bars


@triton.jit
def _ring_close(bars, lane, after, S: tl.constexpr):
    """Invalidate the ring's mbarriers once ``after`` (a value of the last step) is computed."""
    for s in tl.static_range(S):
        _mbar_inval(bars + 8 * s, lane, after)


@triton.jit
def _run_addr(pt_ptr, n0, kbase, s_page, PAGE: tl.constexpr):
    """The global address (int64) of the (page, KV head) run holding the 16-row tile at row ``n0``
    (``kbase``: the K data of the head in page 0, as an int64 byte address)."""
    return _page_addr(tl.load(pt_ptr + n0 // PAGE).to(tl.int32), s_page, kbase)


@triton.jit
def _ring_pages(pt_ptr, j, nsteps, start, lane, TPI: tl.constexpr, PAGE: tl.constexpr):
    """Lane ``k < TPI``: the page id of step ``j``'s tile ``k`` (row ``start + 16 (TPI j + k)``); 0 elsewhere
    and from ``nsteps`` on. NOTE: loaded a step before ``_ring_put`` takes it, so no copy waits on it."""
    L = lane % 32
    copy = (j < nsteps) & (L < TPI)
    row = start + 16 * (TPI * j + tl.where(copy, L, 0))
    return tl.load(pt_ptr + row // PAGE, mask=copy, other=0).to(tl.int32)


@triton.jit
def _ring_put(ring, bars, j, nsteps, pages, kbase, s_page, lane, after,
              S: tl.constexpr, TPI: tl.constexpr, RUN: tl.constexpr):  # fmt: skip
    """Start step ``j``'s copies (nothing from ``nsteps`` on): lane ``k < TPI`` copies the ``RUN`` bytes
    of tile ``k`` (on page ``pages``, ``_ring_pages``) into stage ``j % S`` at ``k * RUN``, lane 0 arms the
    stage's mbarrier for ``TPI * RUN`` bytes. ``after``: a value of the step that read the stage last."""
    L = lane % 32
    z = L * 0
    live = j < nsteps
    copy = live & (L < TPI)
    src = _page_addr(pages, s_page, kbase)
    st = j % S
    dst = ring + st * _STAGE + tl.where(copy, L, 0) * RUN
    return _ring_issue(bars + 8 * st, z + TPI * RUN, dst, src, z + RUN, copy, live & (L == 0), after)


@triton.jit
def _ring_start(lane, kbase, start, full_end, pt_ptr, s_page, after,
                S: tl.constexpr, TPI: tl.constexpr, RUN: tl.constexpr, PAGE: tl.constexpr):  # fmt: skip
    """Open the ring for the full steps of ``[start, full_end)`` (``TPI`` tiles a step) and start the first
    ``S - 1`` steps' copies: (ring, mbarriers, steps, the page ids of the first step ``_ring_next``
    copies)."""
    ring, bars = _ring_open(lane, S)
    nsteps = (full_end - start) // (16 * TPI)
    for j in tl.static_range(S - 1):
        pj = _ring_pages(pt_ptr, j, nsteps, start, lane, TPI, PAGE)
        _ring_put(ring, bars, j, nsteps, pj, kbase, s_page, lane, after, S, TPI, RUN)
    return ring, bars, nsteps, _ring_pages(pt_ptr, S - 1, nsteps, start, lane, TPI, PAGE)


@triton.jit
def _ring_next(ring, bars, i, nsteps, pages, start, pt_ptr, kbase, s_page, lane, after,
               S: tl.constexpr, TPI: tl.constexpr, RUN: tl.constexpr, PAGE: tl.constexpr):  # fmt: skip
    """Step ``i``: start step ``i + S - 1``'s copies (on ``pages``), load step ``i + S``'s page ids, wait
    until stage ``i % S`` holds step ``i``: (the stage's address, the page ids). ``after``: a value of
    step ``i - 1`` (NOTE: the stage it read is the one refilled here)."""
    _ring_put(ring, bars, i + S - 1, nsteps, pages, kbase, s_page, lane, after, S, TPI, RUN)
    nxt = _ring_pages(pt_ptr, i + S, nsteps, start, lane, TPI, PAGE)
    st = i % S
    return ring + st * _STAGE + _ring_wait(bars + 8 * st, (i // S) & 1), nxt
