"""Token-balanced split-K for ``decode_mma`` (``DecodeKernel.BALANCED``): equal work per warp, ragged or not.

Why: ``decode_mma`` (like every split-K decode here) gives each (request, KV head) pair the same number of
splits, so a batch's time is its longest request's (one 32K request among 63 of 1K: that request's warps
read 8K tokens each while the average warp reads ~360), and a batch whose pair count does not divide the
GPU's warp slots leaves slots idle for the whole kernel (91 requests x 8 KV heads = 728 pairs -> 2 splits
-> 1456 of 2112 one-warp slots busy; the engine's nvfp4 step at that batch was 1.66x its memory floor
on the H200). Here the main pool's 16-token tiles of all pairs, in (request, KV
head) order, form one sequence cut into ``W`` (one wave of warps) equal chunks; warp ``w`` attends chunk
``w``, which may finish one pair and start the next -- the load-balanced decode schedule of FlashInfer and
FlashDecoding++ (stream-K, for GEMMs).

Partial slots (``[slots, G, D]`` fp32 and ``[slots, G]`` lse): warp ``w``'s part of pair ``p`` is slot
``w + p`` -- unique, because pair ``p``'s warps are ``fw(p)..lw(p)`` with ``fw(p + 1) >= lw(p)`` -- so every
partial fits ``W + P`` slots (``P`` = pairs of the launch); the bf16 tail of pair ``p`` (one more one-warp
program per pair, ``_mma_tail``) is slot ``W + P + p``. The combine step finds ``fw``/``lw`` from the same
prefix sums. Each program computes the prefix sums of tiles per request itself (a vector load of ``lens``
and a cumsum): no extra launch and nothing to precompute per step, so CUDA graphs need nothing new.

``bal_heads`` (head-aligned): the sequence is the requests' tiles, cut into ``W / H`` chunks (``H`` KV
heads), and warp ``c * H + h`` attends chunk ``c`` for head ``h`` -- the ``H`` warps reading one page's
heads run together, as per-pair splits have them; slot ``(c + b) * H + h``, unique by the same argument.

``plan_balanced`` is the host twin of the schedule (tests check its invariants and the kernel against it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels._common import interpreting, num_sms, scale_tensors
from nibblekv.kernels.decode.combine import (
    _load_slots,
    _merge_rows,
    combine_chunk,
    empty_partials,
)
from nibblekv.kernels.decode.config import (
    _mma_max_registers,
    combine_dim_block,
    prefetch_args,
)
from nibblekv.kernels.decode.launch_config import DecodeConfig
from nibblekv.kernels.decode.mma import _mma_segment
from nibblekv.kernels.decode.mma256 import _mma256_segment
from nibblekv.kernels.decode.mma256_tail import _mma_tail256
from nibblekv.kernels.decode.mma_tail import _mma_tail


def plan_balanced(
    lens: list[int], kv_heads: int, warps: int, min_tiles: int, heads_aligned: bool = False
) -> list[tuple[int, int, int, int, int]]:
    """The schedule ``decode_mma_bal_kernel`` runs: ``(warp, pair, first token, end token, slot)`` for every
    segment, pairs ``b * kv_heads + h``; ``min_tiles`` = the least 16-token tiles a warp gets.
    ``heads_aligned`` (``DecodeConfig.bal_heads``): ``warps // kv_heads`` chunks over the requests' tiles,
    warp ``c * kv_heads + h`` attends chunk ``c`` for KV head ``h``."""
    tiles = [-(-n // 16) for n in lens]
    heads = 1 if heads_aligned else kv_heads  # pairs a request contributes to the cut sequence
    groups = warps // kv_heads if heads_aligned else warps
    total = sum(tiles) * heads
    chunk = max(-(-total // groups), min_tiles) if total else 1
    segs = []
    for c in range(groups):
        x0, x1 = c * chunk, min((c + 1) * chunk, total)
        start = 0  # index in the cut sequence where request b's tiles begin
        for b, t in enumerate(tiles):
            for j in range(heads):
                lo, hi = max(x0, start + j * t), min(x1, start + (j + 1) * t)
                if lo < hi:
                    t0 = lo - start - j * t
                    end = min(16 * (t0 + hi - lo), lens[b])
                    if heads_aligned:  # every KV head of request b: warp c * H + h, slot (c + b) * H + h
                        for h in range(kv_heads):
                            w, p = c * kv_heads + h, b * kv_heads + h
                            segs.append((w, p, 16 * t0, end, (c + b) * kv_heads + h))
                    else:
                        p = b * kv_heads + j
                        segs.append((c, p, 16 * t0, end, c + p))
            start += heads * t
    return segs


@triton.jit
def _tile_prefix(lens_ptr, n_act, BP: tl.constexpr):
    """Inclusive prefix sums ``[BP]`` of 16-token tiles per request over the first ``n_act`` (0 past them),
    and the index vector."""
    idx = tl.arange(0, BP)
    n = tl.load(lens_ptr + idx, mask=idx < n_act, other=0).to(tl.int32)
    return tl.cumsum((n + 15) // 16, axis=0), idx


@triton.jit
def _chunk(total, W: tl.constexpr, MINC: tl.constexpr):
    """Tiles per warp: the total over ``W`` warps, at least ``MINC`` tokens' worth."""
    return tl.maximum(tl.cdiv(total, W), MINC // 16)


@triton.jit
def decode_mma_bal_kernel(
    q_ptr, s_qb, s_qh,
    k_ptr, v_ptr, ks_ptr, vs_ptr, g_ptr,
    s_page, s_head, sc_page, sc_head,
    pt_ptr, s_pt, lens_ptr,
    tk_ptr, tv_ptr, t_page, t_head, t_tok, tpt_ptr, s_tpt, tlens_ptr,
    o_ptr, lse_ptr, sm_scale, n_req, act_ptr,
    HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, TPAGE: tl.constexpr,
    BP: tl.constexpr, W: tl.constexpr, HAS_TAIL: tl.constexpr, TPI: tl.constexpr, PF: tl.constexpr,
    MINC: tl.constexpr, VST: tl.constexpr, VQ: tl.constexpr, DYN: tl.constexpr,
    L2: tl.constexpr = 0, LZ: tl.constexpr = 0, HA: tl.constexpr = 0, L2B: tl.constexpr = 0,
    SMS: tl.constexpr = 0,
):  # fmt: skip
    """1-D grid: ``W`` one-warp programs over the balanced chunks, then (``HAS_TAIL``) one tail program per
    pair. ``n_req`` requests, of which the first ``*act_ptr`` are real with ``DYN`` (CUDA-graph padding).
    ``HA`` (``DecodeConfig.bal_heads``; ``W`` a multiple of the KV heads): ``W / HKV`` chunks of the
    requests' tiles, program ``c * HKV + h`` attends chunk ``c`` for KV head ``h`` (slot ``(c + b) * HKV +
    h``), else ``W`` chunks of the pairs' tiles (slot ``pid + b * HKV + h``)."""
    HKV: tl.constexpr = HQ // G
    HW: tl.constexpr = 1 + HA * (HKV - 1)  # warps a chunk (one a KV head with HA) = a pair's slot stride
    NH: tl.constexpr = HKV // HW  # pairs a request contributes to the cut sequence
    pid = tl.program_id(0)
    n_act = n_req
    if DYN:
        n_act = tl.load(act_ptr)
    if pid >= W:  # the bf16 tail of pair pid - W
        if HAS_TAIL:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
            pair = pid - W
            b = pair // HKV
            if b < n_act:
                slot = W + n_req * HKV + pair
                if D == 256:  # the same on two 128-dim halves (decode.mma256)
                    _mma_tail256(
                        q_ptr + b.to(tl.int64) * s_qb, s_qh, tk_ptr, tv_ptr, t_page, t_head, t_tok,
                        tpt_ptr + b.to(tl.int64) * s_tpt, tl.load(tlens_ptr + b), pair % HKV,
                        sm_scale * 1.4426950408889634,
                        o_ptr + slot.to(tl.int64) * (G * D), lse_ptr + slot.to(tl.int64) * G, D, G, TPAGE, VST,
                    )  # fmt: skip
                else:
                    _mma_tail(
                        q_ptr + b.to(tl.int64) * s_qb, s_qh, tk_ptr, tv_ptr, t_page, t_head, t_tok,
                        tpt_ptr + b.to(tl.int64) * s_tpt, tl.load(tlens_ptr + b), pair % HKV,
                        sm_scale * 1.4426950408889634,
                        o_ptr + slot.to(tl.int64) * (G * D), lse_ptr + slot.to(tl.int64) * G, D, G, D, TPAGE, VST,
                    )  # fmt: skip
        return
    incl, idx = _tile_prefix(lens_ptr, n_act, BP)
    c = pid // HW
    x0 = c * _chunk(tl.max(incl, axis=0) * NH, W // HW, MINC)
    more = True
    while more:
        # NOTE: all but x0 is recomputed per segment (a few loads and one cumsum) to keep what stays live
        # across _mma_segment small: it fills the 128-register cap (tests/test_kernels_decode_sass.py)
        if DYN:
            n_act = tl.load(act_ptr)
        incl, idx = _tile_prefix(lens_ptr, n_act, BP)
        total = tl.max(incl, axis=0) * NH
        x1 = tl.minimum((c + 1) * _chunk(total, W // HW, MINC), total)
        more = x0 < x1
        if more:
            # the request holding tile x0: the count of requests that end at or before it (an empty one
            # ends where it starts, so it is counted and skipped); past n_act the prefix holds the total
            b = tl.sum((incl * NH <= x0).to(tl.int32), axis=0)
            rows = tl.load(lens_ptr + b).to(tl.int32)
            tiles = (rows + 15) // 16
            base = (tl.sum(tl.where(idx == b, incl, 0), axis=0) - tiles) * NH  # request b's first tile
            if HA:
                h = pid % HKV
                t0 = x0 - base
                slot = ((c + b) * HKV + h).to(tl.int64)
            else:
                h = (x0 - base) // tiles
                t0 = x0 - base - h * tiles
                slot = (pid + b * HKV + h).to(tl.int64)
            nt = tl.minimum(tiles - t0, x1 - x0)
            end = tl.minimum((t0 + nt) * 16, rows)
            gk = tl.load(g_ptr) * 16384.0  # see decode_mma_kernel: the codes' 2**-14
            gv = tl.load(g_ptr + 1) * 16384.0
            if D == 256:  # the head_dim-128 step on two halves (decode.mma256)
                _mma256_segment(
                    q_ptr + b.to(tl.int64) * s_qb, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page,
                    sc_head, pt_ptr + b.to(tl.int64) * s_pt, t0 * 16, end, h,
                    sm_scale * 1.4426950408889634 * gk, gv,
                    o_ptr + slot * (G * D), lse_ptr + slot * G, D,
                    G, PAGE, 1, TPI, PF, VST, VQ, L2, LZ, L2B, SMS,
                )  # fmt: skip
            else:
                _mma_segment(
                    q_ptr + b.to(tl.int64) * s_qb, s_qh, k_ptr, v_ptr, ks_ptr, vs_ptr, s_page, s_head, sc_page,
                    sc_head, pt_ptr + b.to(tl.int64) * s_pt, t0 * 16, end, end, h,
                    sm_scale * 1.4426950408889634 * gk, gv,
                    o_ptr + slot * (G * D), lse_ptr + slot * G, D,
                    G, D, PAGE, 1, TPI, PF, 0, VST, VQ, L2, LZ, L2B, SMS,
                )  # fmt: skip
            x0 += nt


@triton.jit
def _combine_bal_kernel(
    o_ptr, lse_ptr, lens_ptr, out_ptr, s_ob, s_oh, n_req, act_ptr, lse_out,
    HQ: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, BP: tl.constexpr,
    W: tl.constexpr, MINC: tl.constexpr, HAS_TAIL: tl.constexpr, DYN: tl.constexpr,
    WRITE_LSE: tl.constexpr, CH: tl.constexpr, HA: tl.constexpr = 0,
):  # fmt: skip
    """Merge the partials of one (request, KV head) pair -- its ``G`` query heads (``GP`` = the next power of
    two) -- for dims ``[DB * pid1, DB * (pid1 + 1))``, ``CH`` slots at a time; padding rows (``DYN``) and
    empty contexts come out zeros.

    NOTE: a pair's slots hold all G heads side by side, so one program per pair reads them as one
    ``[CH, G, DB]`` run and computes the prefix sums once for G heads. And one online pass (the tail's slot
    and the first chunk of split slots load before either is used): two dependent memory round trips
    (``lens``, then the slots). H200, a program per query head and three round trips: 6.0 / 10.6 / 19.4 us
    of 105 / 200 / 383 us decode calls at B32 / B64 / B128 x 8K.
    """
    HKV: tl.constexpr = HQ // G
    HW: tl.constexpr = 1 + HA * (HKV - 1)  # as decode_mma_bal_kernel
    NH: tl.constexpr = HKV // HW
    p = tl.program_id(0)  # p = b * HKV + h
    b = p // HKV
    h = p % HKV
    n_act = n_req
    if DYN:
        n_act = tl.load(act_ptr)
    live = b < n_act
    incl, idx = _tile_prefix(lens_ptr, n_act, BP)
    total = tl.max(incl, axis=0) * NH
    chunk = _chunk(total, W // HW, MINC)
    tiles = tl.where(live, (tl.load(lens_ptr + b).to(tl.int32) + 15) // 16, 0)
    first_tile = (tl.sum(tl.where(idx == b, incl, 0), axis=0) - tiles) * NH + h * tiles * (1 - HA)
    fw = first_tile // chunk
    n = tl.where(tiles > 0, (first_tile + tiles - 1) // chunk - fw + 1, 0)
    first = (fw * HW + p).to(tl.int64)  # chunk fw + i of pair p: slot first + i * HW
    offs_g = tl.arange(0, GP)
    gm = offs_g < G
    offs_d = tl.program_id(1) * DB + tl.arange(0, DB)
    tslot = (W + n_req * HKV + p).to(tl.int64)
    tm = gm & live & (HAS_TAIL > 0)
    lse_t = tl.load(lse_ptr + tslot * G + offs_g, mask=tm, other=float("-inf"))  # [GP]
    o_t = tl.load(o_ptr + (tslot * G + offs_g)[:, None] * D + offs_d[None, :], mask=tm[:, None], other=0.0)
    offs_c = tl.arange(0, CH)
    cm = gm[:, None] & (offs_c < n)[None, :]
    lse_c, o_c = _load_slots(o_ptr, lse_ptr, offs_g, first + offs_c * HW, cm, offs_d, 1, G, D)  # G heads/slot
    m = tl.full([GP], float("-inf"), tl.float32)
    m, l, acc = _merge_rows(lse_t[:, None], o_t[:, None, :], m, tl.zeros([GP], tl.float32),
                            tl.zeros([GP, DB], tl.float32))  # fmt: skip
    m, l, acc = _merge_rows(lse_c, o_c, m, l, acc)
    s0 = CH + 0 * n
    while s0 < n:  # NOTE: only where a pair has more than CH slots (small batches: few, long pairs)
        offs_c = s0 + tl.arange(0, CH)
        cm = gm[:, None] & (offs_c < n)[None, :]
        lse_c, o_c = _load_slots(o_ptr, lse_ptr, offs_g, first + offs_c * HW, cm, offs_d, 1, G, D)
        m, l, acc = _merge_rows(lse_c, o_c, m, l, acc)
        s0 += CH
    hq = h * G + offs_g
    if WRITE_LSE:  # noqa: SIM102 - a constexpr: resolved at compile time, the inner test at run time
        if tl.program_id(1) == 0:
            lse = tl.where(l > 0, m + tl.log2(tl.maximum(l, 1e-30)), float("-inf"))
            tl.store(lse_out + b * HQ + hq, lse, mask=gm)
    res = acc * (1.0 / tl.where(l > 0, l, 1.0))[:, None]  # an empty context yields zeros, never NaN
    optr = out_ptr + b.to(tl.int64) * s_ob + hq[:, None] * s_oh + offs_d[None, :]
    tl.store(optr, res.to(out_ptr.dtype.element_ty), mask=gm[:, None])


def launch_balanced(
    q: torch.Tensor, cache: LayerKV, page_table: torch.Tensor, lens: torch.Tensor, sm_scale: float,
    tail_ops: tuple, has_tail: bool, cfg: DecodeConfig, out: torch.Tensor,
    lse_out: torch.Tensor | None, active: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    """``decode_triton``'s ``BALANCED`` kernel (its caller checked shapes and that this kernel applies:
    head_dim 128 or 256, one warp per program, the tail in the grid, ``vq`` only for vector-loadable Q).
    ``tail_ops``: ``tail_operands``' result. Returns the compiled decode kernel."""
    tk, tv, ts, tpt, ttl, tpage = tail_ops
    bsz, hq, d = q.shape
    hkv = cache.layout.num_kv_heads
    g = hq // hkv
    per_sm = cfg.bal_ppsm
    warps = per_sm * num_sms()
    if cfg.bal_heads:  # NOTE: whole groups of one warp per KV head (the kernel's W / HKV chunks)
        warps = max(1, warps // hkv) * hkv
    interp = interpreting()
    o_part, lse_part = empty_partials(
        (partial_slots(warps, bsz * hkv, has_tail), g), d, q.device, interp, cfg.partial_dtype
    )
    ks, vs, (sp, sh, _) = scale_tensors(cache)
    ds = cache.k_data.stride()
    dyn = int(active is not None)
    bp = max(2, triton.next_power_of_2(bsz))
    grid = (warps + bsz * hkv * int(has_tail),)
    k = decode_mma_bal_kernel[grid](
        q, q.stride(0), q.stride(1), cache.k_data, cache.v_data, ks, vs, cache.global_scale,
        ds[0], ds[1], sp, sh, page_table, page_table.stride(0), lens,
        tk, tv, ts[0], ts[1], ts[2], tpt, tpt.stride(0), ttl,
        o_part, lse_part, float(sm_scale), bsz, active if dyn else lens,
        HQ=hq, G=g, D=d, PAGE=cache.layout.page_size, TPAGE=tpage, BP=bp, W=warps, HAS_TAIL=int(has_tail),
        TPI=cfg.tpi, MINC=cfg.minc, VST=cfg.vst, VQ=cfg.vq, LZ=cfg.lazy_rescale, HA=cfg.bal_heads,
        **prefetch_args(cache, cfg, g, per_sm),
        DYN=dyn, num_warps=1, num_stages=1,
        **({} if interp else {"maxnreg": _mma_max_registers(per_sm)}),
    )  # fmt: skip
    slots = max_pair_slots(warps, hkv)
    db = cfg.combine_db or combine_dim_block(bsz * hkv, slots, d)
    gp = triton.next_power_of_2(g)
    _combine_bal_kernel[(bsz * hkv, d // db)](
        o_part, lse_part, lens, out, out.stride(0), out.stride(1), bsz, active if dyn else lens,
        lse_out if lse_out is not None else lse_part,
        HQ=hq, G=g, GP=gp, D=d, DB=db, BP=bp, W=warps, MINC=cfg.minc,
        HAS_TAIL=int(has_tail), DYN=dyn, WRITE_LSE=int(lse_out is not None),
        CH=combine_chunk(gp, db), HA=cfg.bal_heads, num_warps=4,
    )  # fmt: skip
    return k


def max_pair_slots(warps: int, kv_heads: int) -> int:
    """The most partial slots one pair can have: its tiles are <= total / kv_heads, split in chunks of
    >= total / warps tiles, so <= warps / kv_heads + 1 chunks, + 1 for a chunk boundary inside a tile run."""
    return warps // kv_heads + 2


def partial_slots(warps: int, pairs: int, has_tail: bool) -> int:
    """Slots ``decode_mma_bal_kernel`` writes at most: ``warps + pairs`` main ones (slot ``w + p``; with
    ``bal_heads`` ``(c + b) * H + h`` for chunk ``c < warps / H``), and one tail slot per pair."""
    return warps + pairs * (1 + int(has_tail))


__all__ = ["decode_mma_bal_kernel", "launch_balanced", "max_pair_slots", "partial_slots", "plan_balanced"]
