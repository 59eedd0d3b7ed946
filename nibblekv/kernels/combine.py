"""The split-K combine step: merge each (request, query head)'s partial outputs into its result.

Decode and extend kernels that split a context write, per slot, an fp32 partial output and its
log2-sum-exp2 of scaled scores; ``_combine_kernel`` merges the slots of one row with weights
``2**(lse_s - max lse)`` (``decode_fixup`` is the in-kernel twin). decode_mma's slot layout (splits of
``mma_chunk`` tokens, the tail's slots last, CUDA-graph padding rows) is read through ``MMA_SPLITS`` / ``DYN``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from nibblekv.kernels._pdl import pdl_enter
from nibblekv.kernels.decode_mma import dyn_splits, mma_chunk


@triton.jit
def _merge_partials(lse_c, o_c, m, l, acc):
    """Online merge of partials ``lse_c [N]`` (log2-sum-exp2, -inf = empty), ``o_c [N, DB]`` into the
    running max ``m``, weight sum ``l`` (relative to ``m``) and weighted sum ``acc [DB]``."""
    m_new = tl.maximum(m, tl.max(lse_c, axis=0))
    base = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp2(m - base)  # 0 while nothing was merged (m = -inf)
    w = tl.where(lse_c > float("-inf"), tl.exp2(lse_c - base), 0.0)
    return m_new, l * alpha + tl.sum(w, axis=0), acc * alpha + tl.sum(o_c * w[:, None], axis=0)


@triton.jit
def _combine_online(o_part, lse_part, r, n_valid, live, offs_d, S: tl.constexpr, D: tl.constexpr,
                    DB: tl.constexpr, CH: tl.constexpr, HAS_TAIL: tl.constexpr,
                    TAIL_SLOTS: tl.constexpr, TB: tl.constexpr):  # fmt: skip
    """``_combine_kernel``'s many-slot case in one pass: the tail's slots and each chunk of ``CH`` split slots
    load lse and partials together, so a short context costs two dependent memory round trips (its length,
    then everything) instead of four. Returns (``acc [DB]``, max ``m``, weight sum ``l``): ``acc / l``."""
    # NOTE: the tail's slots: one per tail program (two with PAIR: one per token parity), TB >= TAIL_SLOTS
    offs_t = S - TAIL_SLOTS + tl.arange(0, TB)
    tmask = (tl.arange(0, TB) < TAIL_SLOTS) & (HAS_TAIL > 0) & live
    lse_t = tl.load(lse_part + r * S + offs_t, mask=tmask, other=float("-inf"))
    o_t = tl.load(o_part + (r * S + offs_t)[:, None] * D + offs_d[None, :], mask=tmask[:, None], other=0.0)
    offs_c = tl.arange(0, CH)
    cmask = offs_c < n_valid
    lse_c = tl.load(lse_part + r * S + offs_c, mask=cmask, other=float("-inf"))
    o_c = tl.load(o_part + (r * S + offs_c)[:, None] * D + offs_d[None, :], mask=cmask[:, None], other=0.0)
    m = tl.full([], float("-inf"), tl.float32)
    m, l, acc = _merge_partials(lse_t, o_t, m, tl.zeros([], tl.float32), tl.zeros([DB], tl.float32))
    m, l, acc = _merge_partials(lse_c, o_c, m, l, acc)
    s0 = CH + 0 * n_valid
    while s0 < n_valid:  # NOTE: only past CH split slots (the engine's B=1 x 3K: 49 of 256)
        offs_c = s0 + tl.arange(0, CH)
        cmask = offs_c < n_valid
        lse_c = tl.load(lse_part + r * S + offs_c, mask=cmask, other=float("-inf"))
        o_rows = (r * S + offs_c)[:, None] * D
        o_c = tl.load(o_part + o_rows + offs_d[None, :], mask=cmask[:, None], other=0.0)
        m, l, acc = _merge_partials(lse_c, o_c, m, l, acc)
        s0 += CH
    return acc, m, l


@triton.jit
def _combine_kernel(o_part, lse_part, out_ptr, s_ob, s_oh, HQ: tl.constexpr, S: tl.constexpr, BS: tl.constexpr,
                    D: tl.constexpr, DB: tl.constexpr, lens_ptr=None, MMA_SPLITS: tl.constexpr = 0,
                    MMA_NW: tl.constexpr = 1, MINC: tl.constexpr = 16, HAS_TAIL: tl.constexpr = 0,
                    PAIR: tl.constexpr = 0, lse_out=None, WRITE_LSE: tl.constexpr = 0,
                    TAIL_SLOTS: tl.constexpr = 1, act_ptr=None, warp_slots=0, reserve_per_req=0,
                    WARPS_PER_REQ: tl.constexpr = 1, DYN: tl.constexpr = 0,
                    ONLINE: tl.constexpr = 0, TB: tl.constexpr = 2, PDL: tl.constexpr = 0):  # fmt: skip
    """Merge the split partials of one (request, query head) for dims ``[DB * pid1, DB * (pid1 + 1))``:
    weights ``2**(lse_s - max lse)``. ``WRITE_LSE``: also ``lse_out[r]`` = the merged log2-sum-exp2 of the
    scores (-inf for an empty context), for a caller that merges this result with another partial.

    NOTE: slots go in chunks of CH and dims in blocks of DB (``combine_dim_block``): a ``[BS, D]`` tile in
    registers spills once BS reaches ~128 (decode_mma writes one slot per warp, up to 257 per head), and a
    single program per head looping over many chunks is latency-bound when the batch is small (B=1: 32
    programs).

    ``DYN`` (decode_mma's ``DYN``): rows of requests ``>= *act_ptr`` are padding -- nothing was written for
    them and they come out as zeros; the real ones used ``dyn_splits`` splits. ``ONLINE`` (decode_mma, more
    slots than one chunk): :func:`_combine_online`.
    """
    pdl_enter(PDL)  # NOTE: before the first load of the decode kernel's partials
    r = tl.program_id(0).to(tl.int64)  # r = b * HQ + head
    offs_s = tl.arange(0, BS)
    n_valid = S
    live = r >= 0
    if MMA_SPLITS > 0:  # decode_mma skips splits past the context: only cdiv(n, chunk) of them wrote slots
        n = tl.load(lens_ptr + r // HQ)
        n = (n + PAIR) // (1 + PAIR)  # PAIR: rows of two tokens (decode_mma_kernel)
        s_run = MMA_SPLITS
        if DYN:
            act = tl.load(act_ptr)
            live = r // HQ < act
            s_run = dyn_splits(act, MMA_SPLITS, warp_slots, WARPS_PER_REQ, reserve_per_req)
            n = tl.where(live, n, 0)
        n_valid = tl.cdiv(n, mma_chunk(n, s_run, MINC)) * MMA_NW
    # NOTE: the tail's slots are the last TAIL_SLOTS (decode_mma with PAIR in its grid: one per parity)
    smask = (offs_s < n_valid) | ((offs_s >= S - TAIL_SLOTS) & (offs_s < S) & (HAS_TAIL > 0) & live)
    offs_d = tl.program_id(1) * DB + tl.arange(0, DB)
    CH_MAX: tl.constexpr = 4096 // DB  # a [CH, DB] fp32 chunk: 32 registers per thread (4 warps)
    if ONLINE and MMA_SPLITS > 0 and BS > CH_MAX:
        acc, mo, lo = _combine_online(o_part, lse_part, r, n_valid, live, offs_d, S, D, DB, CH_MAX, HAS_TAIL,
                                      TAIL_SLOTS, TB)  # fmt: skip
        if WRITE_LSE:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
            if tl.program_id(1) == 0:
                tl.store(lse_out + r, tl.where(lo > 0, mo + tl.log2(tl.maximum(lo, 1e-30)), float("-inf")))
        res = acc * (1.0 / tl.where(lo > 0, lo, 1.0))  # an empty context yields zeros, never NaN
        tl.store(out_ptr + (r // HQ) * s_ob + (r % HQ) * s_oh + offs_d, res.to(out_ptr.dtype.element_ty))
        return
    lse = tl.load(lse_part + r * S + offs_s, mask=smask, other=float("-inf"))
    if BS <= CH_MAX:  # NOTE: one chunk: the partials load beside the lse, not one memory round trip later
        o_all = tl.load(o_part + (r * S + offs_s)[:, None] * D + offs_d[None, :], mask=smask[:, None], other=0.0)
    mx = tl.max(lse, axis=0)
    w = tl.where(smask & (lse > float("-inf")), tl.exp2(lse - mx), 0.0)
    total = tl.sum(w, axis=0)
    inv = 1.0 / tl.where(total > 0, total, 1.0)  # an empty context yields zeros, never NaN
    if WRITE_LSE:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
        if tl.program_id(1) == 0:
            tl.store(lse_out + r, tl.where(total > 0, mx + tl.log2(tl.maximum(total, 1e-30)), float("-inf")))
    if BS <= CH_MAX:
        res = tl.sum(o_all * (w * inv)[:, None], axis=0)
    else:
        CH: tl.constexpr = CH_MAX
        res = tl.zeros([DB], tl.float32)
        # NOTE: only the chunks holding written slots (decode_mma at B=1 x 3K: 49 of 257 slots, one chunk of
        # two); decode_mma's tail slot (S - 1, past every split's) is added on its own below
        s0 = 0
        while s0 < n_valid:
            offs_c = s0 + tl.arange(0, CH)
            cmask = (offs_c < n_valid) | ((offs_c == S - 1) & (HAS_TAIL > 0) & (MMA_SPLITS == 0))
            lse_c = tl.load(lse_part + r * S + offs_c, mask=cmask, other=float("-inf"))
            w_c = tl.where(cmask & (lse_c > float("-inf")), tl.exp2(lse_c - mx), 0.0) * inv
            o = tl.load(o_part + (r * S + offs_c)[:, None] * D + offs_d[None, :], mask=cmask[:, None], other=0.0)
            res += tl.sum(o * w_c[:, None], axis=0)
            s0 += CH
        if MMA_SPLITS > 0 and HAS_TAIL > 0:
            for i in tl.static_range(TAIL_SLOTS):
                slot = S - TAIL_SLOTS + i
                lse_t = tl.load(lse_part + r * S + slot, mask=live, other=float("-inf"))
                w_t = tl.where(lse_t > float("-inf"), tl.exp2(lse_t - mx), 0.0) * inv
                res += tl.load(o_part + (r * S + slot) * D + offs_d, mask=live & (offs_d < D), other=0.0) * w_t
    b = r // HQ
    hq = r % HQ
    tl.store(out_ptr + b * s_ob + hq * s_oh + offs_d, res.to(out_ptr.dtype.element_ty))


__all__ = ["_combine_kernel"]
