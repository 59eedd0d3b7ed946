"""Extend over an NVFP4 prefix for short chunks through ``decode_mma`` (variant ``mma`` of extend; opt-in).

Why: ``extend_triton`` runs every dtype at the same speed -- a chain of ``tl.dot`` blocks whose latency,
not the bytes, sets the time -- so its NVFP4 prefix reads reach only ~0.24 of the H200's ceiling where a
chunk is a few tokens (speculative-decoding checks, the last pieces of a chunked prompt). For such a chunk
every query token sees the WHOLE cached prefix (the causal mask only bites inside the chunk), so the
prefix part is a decode with more query columns: ``decode_mma`` scores 8 columns per KV head in one
``mma.sync`` n-dimension, and here a column is a (query token, query head) pair instead of a head.

Three launches, merged exactly by their log-sum-exps:

1. the main-pool prefix: ``decode_triton(variant="mma")`` on a virtual batch -- request ``b``'s chunk
   becomes ``NG = cdiv(max_chunk * G, GV)`` virtual requests of ``GV <= 8`` columns per KV head (column
   ``cg * GV + n`` = token ``// G``, head ``% G`` of the chunk), all with ``b``'s page table and prefix
   length (the NG copies read the same bytes; concurrent, they mostly hit L2);
2. the rest -- the bf16 tail and the chunk's own keys, causally -- by ``extend_triton`` with an empty
   main-pool prefix;
3. ``o = (o1 * 2**lse1 + o2 * 2**lse2) / (2**lse1 + 2**lse2)`` per row (torch).

Columns past a request's chunk read a clamped query row; their outputs are never gathered back.
"""

from __future__ import annotations

import torch

from nibblekv.kernels.decode import decode_triton
from nibblekv.kernels.decode_config import _mma_unsupported, mma_columns
from nibblekv.kernels.extend import extend_triton
from nibblekv.kernels.types import LayerKV

# NOTE: more virtual requests than this per request re-read (and re-convert) the same prefix bytes more
# often; the tl.dot path converts each byte once for all columns.
MAX_GROUPS = 2


def extend_mma_unsupported(q: torch.Tensor, cache: LayerKV, max_chunk: int) -> str | None:
    """Why :func:`extend_mma` cannot serve this call (None if it can)."""
    g = q.shape[1] // cache.layout.num_kv_heads
    cap = mma_columns(cache.layout.head_dim)
    why = _mma_unsupported(cache, min(cap, g * max_chunk))
    if why is None and max_chunk * g > MAX_GROUPS * cap:
        why = f"needs chunk x GQA group <= {MAX_GROUPS * cap} columns per KV head"
    return why


def extend_mma(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cache: LayerKV,
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    sm_scale: float,
    max_chunk: int,
    tail: LayerKV | None = None,
    tail_page_table: torch.Tensor | None = None,
    tail_prefix_lens: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """``extend_triton``'s contract (``q [T, Hq, D]`` -> ``[T, Hq, D]``) for an NVFP4 pool that ``decode_mma``
    reads; ``max_chunk`` (host int) >= every chunk (``cu_seqlens [B + 1]``), ``max_chunk * G`` at most
    ``MAX_GROUPS`` groups of ``decode_config.mma_columns`` columns. ``num_splits``: decode_mma's split count
    for the prefix (default: one wave of the GPU, as for decode)."""
    why = extend_mma_unsupported(q, cache, max_chunk)
    if why:
        raise ValueError(f"extend variant 'mma' {why}")
    t_total, hq, d = q.shape
    bsz = cu_seqlens.numel() - 1
    hkv = cache.layout.num_kv_heads
    g = hq // hkv
    gv = min(mma_columns(d), max_chunk * g)  # columns per virtual request and KV head
    ng = -(-max_chunk * g // gv)
    dev = q.device
    if out is None:
        out = torch.empty_like(q)
    if bsz == 0 or t_total == 0:
        return out
    cu = cu_seqlens.to(torch.int64)
    starts, lens = cu[:-1], cu[1:] - cu[:-1]
    # 1) virtual batch: row (b, cg), column (h, n) <- q[starts[b] + col // g, h * g + col % g], col = cg*gv + n
    col = torch.arange(ng * gv, device=dev).view(1, ng, 1, gv)
    tok = (starts.view(bsz, 1, 1, 1) + col // g).clamp(max=t_total - 1)  # past the chunk: any valid row
    head = torch.arange(hkv, device=dev).view(1, 1, hkv, 1) * g + col % g
    tok, head = torch.broadcast_tensors(tok, head)
    qv = q[tok.reshape(-1), head.reshape(-1)].view(bsz * ng, hkv * gv, d)
    pv = page_table.repeat_interleave(ng, dim=0)
    lv = prefix_lens.repeat_interleave(ng)
    o1 = torch.empty_like(qv)
    lse1 = torch.empty((bsz * ng, hkv * gv), dtype=torch.float32, device=dev)
    decode_triton(qv, cache, pv, lv, sm_scale, num_splits=num_splits, out=o1, variant="mma", lse_out=lse1)
    # 2) tail + own keys: the same extend with an empty main-pool prefix
    o2 = torch.empty_like(q)
    lse2 = torch.empty((t_total, hq), dtype=torch.float32, device=dev)
    extend_triton(
        q, k_new, v_new, cu_seqlens, cache, page_table, torch.zeros_like(prefix_lens), sm_scale,
        tail, tail_page_table, tail_prefix_lens, max_chunk=max_chunk, out=o2, lse_out=lse2,
        num_splits=1,
    )  # fmt: skip
    # 3) gather each real row's prefix result back and merge
    b_of = torch.repeat_interleave(torch.arange(bsz, device=dev), lens, output_size=t_total)
    c = ((torch.arange(t_total, device=dev) - starts[b_of]) * g).view(t_total, 1) + torch.arange(g, device=dev)
    vrow = (b_of.view(t_total, 1) * ng + c // gv).view(t_total, 1, g).expand(t_total, hkv, g)
    vcol = (torch.arange(hkv, device=dev).view(1, hkv, 1) * gv + (c % gv).view(t_total, 1, g))
    vrow, vcol = vrow.reshape(t_total, hq), vcol.reshape(t_total, hq)
    o1r, lse1r = o1[vrow, vcol].float(), lse1[vrow, vcol]
    m = torch.maximum(lse1r, lse2)  # lse2 is finite: a query token always sees itself
    w1, w2 = torch.exp2(lse1r - m), torch.exp2(lse2 - m)
    res = (o1r * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]
    out.copy_(res.to(out.dtype))
    return out


__all__ = ["MAX_GROUPS", "extend_mma", "extend_mma_unsupported"]
