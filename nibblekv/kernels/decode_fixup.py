"""Split-K fix-up inside the decode kernel: the last program of a (request, KV head) merges its partials.

Why: at medium shapes (B x context of 256K tokens cut into ~1K-token splits) the separate combine launch
is 5-7.5% of the decode time on the H200 (GQA 8, B=8 x 32K /
B=32 x 8K: combine 6.7 / 8.0 us of 107 us for ``decode_mma``, 7.3 / 7.8 of 159 / 160 us for
``decode_tok``) -- the rows that miss issue 3's targets by 0.01-0.03 of the read ceiling.

How (the classic serial split-K fix-up): every program of a pair -- each split, and the bf16 tail's --
writes its partial (o, lse) as before, then draws a ticket from the pair's counter (one atomic add,
acquire-release at GPU scope; Triton's scalar atomic synchronises the CTA first, so all its threads'
partial stores come before the ticket). The program that draws the last ticket sees every partial of
its pair; it merges them as ``combine._combine_kernel`` does (weights ``2**(lse_s - max)``), writes the
output rows (and the merged lse when asked) and puts the counter back to 0 for the next launch.

NOTE (invariants): the counters live in one zeroed int32 buffer per device (:func:`counters`), reused
by every launch -- kernels that use them must not run concurrently (one stream: the engine's); a launch
that draws every ticket leaves every counter it touched at 0, so CUDA-graph replays need no reset.
Partials are read with ``.cg`` (L2): other SMs wrote them during this launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# NOTE: one counter per (request, KV head); 4096 requests x 16 KV heads
MAX_PAIRS = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, pairs: int) -> torch.Tensor | None:
    """The device's zeroed ticket counters, or None when ``pairs`` exceeds them (then: the combine launch).

    NOTE: allocated once per device and kept for the process (a buffer first made during CUDA-graph
    capture lives in the graph's pool; it is never freed, so no later allocation reuses it)."""
    if pairs > MAX_PAIRS:
        return None
    buf = _COUNTERS.get(device)
    if buf is None:
        buf = _COUNTERS[device] = torch.zeros(MAX_PAIRS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def _merge_head(o_ptr, lse_ptr, r, S, n_first, n_last, out_row, lse_out, D: tl.constexpr, CH: tl.constexpr,
                WRITE_LSE: tl.constexpr):  # fmt: skip
    """Merge the written partial slots of query row ``r`` -- the first ``n_first`` and the last ``n_last``
    of its ``S`` (decode_mma leaves the slots of splits past the context unwritten) -- online over chunks
    of ``CH`` slots, into ``out_row [D]``; an empty context (every lse -inf) gives zeros, never NaN."""
    offs_d = tl.arange(0, D)
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    s0 = 0
    while s0 < S:
        offs = s0 + tl.arange(0, CH)
        msk = (offs < n_first) | ((offs >= S - n_last) & (offs < S))
        lse = tl.load(lse_ptr + r * S + offs, mask=msk, other=float("-inf"), cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        ok = m_new > float("-inf")
        alpha = tl.where(ok, tl.exp2(m - tl.where(ok, m_new, 0.0)), 0.0)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - tl.where(ok, m_new, 0.0)), 0.0)
        o = tl.load(o_ptr + (r * S + offs)[:, None] * D + offs_d[None, :], mask=msk[:, None], other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        acc = acc * alpha + tl.sum(o * w[:, None], axis=0)
        l = l * alpha + tl.sum(w, axis=0)
        m = m_new
        s0 += CH
    total = tl.sum(l, axis=0)
    tl.store(out_row + offs_d, (acc / tl.where(total > 0, total, 1.0)).to(out_row.dtype.element_ty))
    if WRITE_LSE:
        mx = tl.max(m, axis=0)
        tl.store(lse_out + r, tl.where(total > 0, mx + tl.log2(tl.maximum(total, 1e-30)), float("-inf")))


# NOTE: noinline: inlined, the merge loop changed the register allocation of the kernels' key loops
# (sm_90 builds: decode_tok FP8 168 -> 186 registers, 3 -> 2 programs per SM)
@triton.jit(noinline=True)
def fixup(cnt_ptr, arrivals, o_ptr, lse_ptr, S, n_first, n_last, out_ptr, s_ob, s_oh, lse_out, b, h,
          HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, CH: tl.constexpr, WRITE_LSE: tl.constexpr):  # fmt: skip
    """Draw this program's ticket for pair ``(b, h)`` (counter ``cnt_ptr``, ``arrivals`` programs in all);
    the last one merges the pair's ``G`` query rows (partials ``[B * HQ, S, D]`` / ``[B * HQ, S]``, slots
    as :func:`_merge_head` reads them) into ``out [B, HQ, D]`` (strides ``s_ob``, ``s_oh``) and resets
    the counter."""
    # NOTE: every thread's partial stores before the ticket (Triton's scalar atomic also synchronises the CTA
    # first; explicit here so the release covers them whatever the lowering)
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == arrivals - 1:
        for g in tl.static_range(G):
            hq = h * G + g
            r = b.to(tl.int64) * HQ + hq
            _merge_head(o_ptr, lse_ptr, r, S, n_first, n_last, out_ptr + b.to(tl.int64) * s_ob + hq * s_oh,
                        lse_out, D, CH, WRITE_LSE)  # fmt: skip
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")


def fixup_ref(o_part: torch.Tensor, lse_part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge :func:`fixup` does, in torch: partials ``[B, HQ, S, D]`` / ``[B, HQ, S]`` (log2-domain
    lse, -inf for an empty slot) -> (out ``[B, HQ, D]`` fp32, lse ``[B, HQ]``)."""
    mx = lse_part.amax(dim=-1, keepdim=True)
    w = torch.where(lse_part > float("-inf"), torch.exp2(lse_part - mx.clamp(min=-1e30)), 0.0)
    total = w.sum(dim=-1)
    out = (o_part * w[..., None]).sum(dim=-2) / torch.where(total > 0, total, 1.0)[..., None]
    lse = torch.where(total > 0, mx.squeeze(-1) + torch.log2(total.clamp(min=1e-30)), float("-inf"))
    return out, lse


__all__ = ["MAX_PAIRS", "counters", "fixup", "fixup_ref"]
