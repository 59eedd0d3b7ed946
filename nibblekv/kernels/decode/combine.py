"""The split-K combine step: merge each (request, query head)'s partial outputs into its result.

Decode and extend kernels that split a context write, per slot, a partial output (fp32; bf16 with
``DecodeConfig.part_bf16``, read here as fp32) and its fp32 log2-sum-exp2 of scaled scores;
``_combine_kernel`` merges the slots of each row with weights ``2**(lse_s - max lse)``. decode_mma's slot
layout (splits of ``mma_chunk`` tokens, the tail's slots last, CUDA-graph padding rows) is read through
``MMA_SPLITS`` / ``DYN``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.kernels.decode.mma import dyn_splits, mma_chunk


@triton.jit
def _load_slots(o_part, lse_part, rows, offs_s, mask, offs_d, RS: tl.constexpr, SS: tl.constexpr,
                D: tl.constexpr):  # fmt: skip
    """lse ``[GP, N]`` (-inf where masked) and partials ``[GP, N, DB]`` (0 there) of slots ``offs_s [N]`` of
    rows ``rows [GP]``; entry ``rows * RS + offs_s * SS`` (lse elements; partials ``D`` times that)."""
    idx = rows[:, None] * RS + offs_s[None, :] * SS
    lse = tl.load(lse_part + idx, mask=mask, other=float("-inf"))
    o = tl.load(o_part + idx[:, :, None] * D + offs_d[None, None, :], mask=mask[:, :, None], other=0.0)
    return lse, o


@triton.jit
def _merge_rows(lse_c, o_c, m, l, acc):
    """Online merge of ``GP`` rows' partials ``lse_c [GP, N]`` (log2-sum-exp2, -inf = empty), ``o_c [GP, N,
    DB]`` into the running max ``m [GP]``, weight sum ``l [GP]`` (relative to ``m``) and weighted sum ``acc
    [GP, DB]``."""
    m_new = tl.maximum(m, tl.max(lse_c, axis=1))
    base = tl.where(m_new > float("-inf"), m_new, 0.0)
    alpha = tl.exp2(m - base)  # 0 while nothing was merged (m = -inf)
    w = tl.where(lse_c > float("-inf"), tl.exp2(lse_c - base[:, None]), 0.0)
    return m_new, l * alpha + tl.sum(w, axis=1), acc * alpha[:, None] + tl.sum(o_c * w[:, :, None], axis=1)


@triton.jit
def _merge_chunk(o_part, lse_part, rows, s0, n, gm, offs_d, m, l, acc, S: tl.constexpr, D: tl.constexpr,
                 CH: tl.constexpr):  # fmt: skip
    """``_merge_rows`` of split slots ``[s0, s0 + CH)`` (those ``< n``)."""
    offs_c = s0 + tl.arange(0, CH)
    mask = gm[:, None] & (offs_c < n)[None, :]
    lse_c, o_c = _load_slots(o_part, lse_part, rows, offs_c, mask, offs_d, S, 1, D)
    return _merge_rows(lse_c, o_c, m, l, acc)


@triton.jit
def _written(lens_ptr, act_ptr, b, MMA_SPLITS, warp_slots, reserve_per_req, WARPS_PER_REQ: tl.constexpr,
             MMA_NW: tl.constexpr, MINC: tl.constexpr, PAIR: tl.constexpr, DYN: tl.constexpr):  # fmt: skip
    """decode_mma's written split slots of request ``b`` (its first ``cdiv(rows, chunk) * MMA_NW``; ``PAIR``:
    rows of two tokens) and whether ``b`` is a real request (``DYN``: ``b < *act_ptr``, else always)."""
    n = tl.load(lens_ptr + b)
    n = (n + PAIR) // (1 + PAIR)
    s_run = MMA_SPLITS
    live = b >= 0
    if DYN:
        act = tl.load(act_ptr)
        live = b < act
        s_run = dyn_splits(act, MMA_SPLITS, warp_slots, WARPS_PER_REQ, reserve_per_req)
        n = tl.where(live, n, 0)
    return tl.cdiv(n, mma_chunk(n, s_run, MINC)) * MMA_NW, live


@triton.jit
def _combine_kernel(o_part, lse_part, out_ptr, s_ob, s_oh, HQ: tl.constexpr, S: tl.constexpr, D: tl.constexpr,
                    DB: tl.constexpr, CH: tl.constexpr, G: tl.constexpr = 1, GP: tl.constexpr = 1,
                    lens_ptr=None, MMA_SPLITS: tl.constexpr = 0,
                    MMA_NW: tl.constexpr = 1, MINC: tl.constexpr = 16, HAS_TAIL: tl.constexpr = 0,
                    PAIR: tl.constexpr = 0, lse_out=None, WRITE_LSE: tl.constexpr = 0,
                    TAIL_SLOTS: tl.constexpr = 1, act_ptr=None, warp_slots=0, reserve_per_req=0,
                    WARPS_PER_REQ: tl.constexpr = 1, DYN: tl.constexpr = 0,
                    TB: tl.constexpr = 2):  # fmt: skip
    """Merge the split partials of ``G`` rows (query heads ``G * pid0 .. G * pid0 + G - 1`` of the flattened
    (request, head) rows; ``GP`` = the next power of two) for dims ``[DB * pid1, DB * (pid1 + 1))``: weights
    ``2**(lse_s - max lse)``, in one online pass over chunks of ``CH`` slots. ``WRITE_LSE``: also
    ``lse_out[r]`` = the merged log2-sum-exp2 of the scores (-inf for an empty context), for a caller that
    merges this result with another partial.

    A row's slots: ``[0, n)`` split partials, then (``HAS_TAIL``) the tail's ``TAIL_SLOTS`` last ones, which
    load beside the first chunk. ``MMA_SPLITS`` > 0 (decode_mma): only the first ``cdiv(rows, chunk) *
    MMA_NW`` splits wrote slots (``PAIR``: rows of two tokens); ``DYN``: rows of requests ``>= *act_ptr``
    are padding -- nothing was written for them and they come out as zeros; the real ones used
    ``dyn_splits`` splits.

    NOTE: one program can serve a KV head's G query heads -- their rows are adjacent (the decode launcher
    groups them where the pairs fill the GPU; extend: G = 1) -- and loads ``lens``, the tail's slots and the
    first ``CH`` split slots at once (one dependent memory round trip where they cover every written slot;
    ``combine_chunk``). H200, a program per query head and three round trips (lens, lse, partials): 5.0 /
    7.7 / 13.3 us of 296 / 197 / 376 us decode calls at B26 x 32K / B64 x 8K / B128 x 8K.
    """
    r0 = tl.program_id(0).to(tl.int64) * G  # first row: b * HQ + head (HQ % G == 0)
    b = r0 // HQ
    offs_g = tl.arange(0, GP)
    gm = offs_g < G
    rows = r0 + offs_g
    S_MAIN: tl.constexpr = S - TAIL_SLOTS * HAS_TAIL
    offs_d = tl.program_id(1) * DB + tl.arange(0, DB)
    offs_c = tl.arange(0, CH)
    tb = tl.arange(0, TB)
    MMA: tl.constexpr = MMA_SPLITS > 0
    n_main = S_MAIN + 0 * b
    live = b >= 0
    # NOTE: the tail's slots (the last TAIL_SLOTS; decode_mma with PAIR in its grid: one per parity)
    # and the first chunk load before lens / act are known -- one memory round trip, not two. Slots no
    # program wrote in this launch (past a short context, padding rows) hold stale values or NaN: masked
    # after the load.
    tmask = gm[:, None] & ((tb < TAIL_SLOTS) & (HAS_TAIL > 0) & live)[None, :]
    lse_t, o_t = _load_slots(o_part, lse_part, rows, S - TAIL_SLOTS + tb, tmask, offs_d, S, 1, D)
    cmask = gm[:, None] & (offs_c < n_main)[None, :]
    lse_c, o_c = _load_slots(o_part, lse_part, rows, offs_c, cmask, offs_d, S, 1, D)
    if MMA:
        n_main, live = _written(lens_ptr, act_ptr, b, MMA_SPLITS, warp_slots, reserve_per_req, WARPS_PER_REQ,
                                MMA_NW, MINC, PAIR, DYN)  # fmt: skip
        lse_t = tl.where(live, lse_t, float("-inf"))  # padding rows (DYN): nothing was written
        o_t = tl.where(live, o_t, 0.0)
        keep = gm[:, None] & (offs_c < n_main)[None, :]
        lse_c = tl.where(keep, lse_c, float("-inf"))
        o_c = tl.where(keep[:, :, None], o_c, 0.0)
    m = tl.full([GP], float("-inf"), tl.float32)
    m, l, acc = _merge_rows(lse_t, o_t, m, tl.zeros([GP], tl.float32), tl.zeros([GP, DB], tl.float32))
    m, l, acc = _merge_rows(lse_c, o_c, m, l, acc)
    if MMA_SPLITS > 0:
        s0 = CH + 0 * n_main
        while s0 < n_main:  # NOTE: only past CH split slots (the engine's B=1 x 3K: 49 of 256)
            m, l, acc = _merge_chunk(o_part, lse_part, rows, s0, n_main, gm, offs_d, m, l, acc, S, D, CH)
            s0 += CH
    else:  # NOTE: a constexpr bound: a `while` over it crashed triton 3.6's TritonGPUCoalesce pass
        for s0 in range(CH, S - TAIL_SLOTS * HAS_TAIL, CH):
            m, l, acc = _merge_chunk(o_part, lse_part, rows, s0, n_main, gm, offs_d, m, l, acc, S, D, CH)
    if WRITE_LSE:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
        if tl.program_id(1) == 0:
            lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
            tl.store(lse_out + rows, lse, mask=gm)
    res = acc * (1.0 / tl.where(l > 0, l, 1.0))[:, None]  # an empty context yields zeros, never NaN
    optr = out_ptr + b * s_ob + (rows % HQ)[:, None] * s_oh + offs_d[None, :]
    tl.store(optr, res.to(out_ptr.dtype.element_ty), mask=gm[:, None])


# elements of one [rows, slots, dims] fp32 chunk the combine merges at once: 64 registers a thread at 4 warps.
# NOTE: each further chunk is one more dependent memory round trip (~0.6 us): 4096 split GQA 8's 33 slots
# (B=8 x 32K, a row a program) and the balanced kernel's ~10 a pair (B=32 x 8K) into two chunks.
COMBINE_ELEMS = 8192


def combine_chunk(gp: int, db: int, slots: int | None = None) -> int:
    """Slots per chunk (a power of two) for ``gp`` rows x ``db`` dims: ``COMBINE_ELEMS`` elements at most,
    and no more than ``slots`` (the most a row has, when known) need."""
    ch = max(1, triton.next_power_of_2(COMBINE_ELEMS // (gp * db) + 1) // 2)
    return ch if slots is None else min(ch, triton.next_power_of_2(max(1, slots)))


def empty_partials(
    lead: tuple[int, ...], d: int, device: torch.device, nan: bool, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The partial buffers a split decode writes for this step: outputs ``[*lead, d]`` in ``dtype`` and their
    lse ``lead`` in fp32 (NaN-filled for interpreter tests: a slot read but never written shows)."""
    o = torch.empty((*lead, d), dtype=dtype, device=device)
    lse = torch.empty(lead, dtype=torch.float32, device=device)
    if nan:
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
    return o, lse


__all__ = [
    "COMBINE_ELEMS", "_combine_kernel", "_load_slots", "_merge_rows", "combine_chunk", "empty_partials",
]
