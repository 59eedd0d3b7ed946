"""Pure-torch reference twins of the cache kernels: readable, slow, the definition.

Conventions shared with the Triton kernels (``nibblekv.kernels``):

* The attention twins read one layer's paged KV through the view ``formats.PagedKV`` (as the public ops
  and the Triton launchers do): a request's context is ``lens[b]`` tokens in the main (possibly quantized)
  pool, read through ``page_table[b]``, followed by ``tail_lens[b]`` tokens in the unquantized tail
  pool, read through ``tail_page_table[b]``. Token ``i`` of a pool lives at page
  ``table[i // page_size]``, offset ``i % page_size``.
* GQA: query head ``h`` uses KV head ``h // (q_heads // kv_heads)``.
* Attention math is FP32 on dequantized values; outputs take ``q``'s dtype.
"""

from __future__ import annotations

import torch

from nibblekv.formats import nvfp4
from nibblekv.formats.kv_view import PagedKV, TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.formats.layout import KVDtype, dequantize_rows, quantize_rows
from nibblekv.formats.sm_words import to_sm


def _quantize(
    x: torch.Tensor, cache: LayerKV, g: torch.Tensor, four_over_six: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows in the cache's format; ``four_over_six`` picks NVFP4 block scales by 4over6 (see nvfp4)."""
    if four_over_six and cache.dtype is KVDtype.NVFP4:
        data, scale = nvfp4.quantize(x, g, four_over_six=True)
        return to_sm(data), scale
    return quantize_rows(x, cache.dtype, g)


def write_kv_ref(
    k: torch.Tensor, v: torch.Tensor, cache: LayerKV, slots: torch.Tensor, four_over_six: bool = False
) -> None:
    """Store rows ``k, v [T, kv_heads, D]`` at ``slots [T]`` (int; -1 = skip), quantizing as the cache's dtype."""
    valid = slots >= 0
    slots = slots[valid].long()
    pages, offs = slots // cache.page_size, slots % cache.page_size
    for x, data, scale, g in (
        (k[valid], cache.k_data, cache.k_scale, cache.global_scale[0]),
        (v[valid], cache.v_data, cache.v_scale, cache.global_scale[1]),
    ):
        qd, qs = _quantize(x, cache, g, four_over_six)
        data[pages, :, offs] = qd
        if scale is not None:
            scale[pages, :, offs] = qs


def gather_kv(cache: LayerKV, table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` tokens of one request, dequantized: float32 ``[length, kv_heads, D]`` each."""
    pos = torch.arange(length, device=table.device)
    pages = table[pos // cache.page_size].long()
    offs = pos % cache.page_size
    out = []
    for data, scale, g in (
        (cache.k_data, cache.k_scale, cache.global_scale[0]),
        (cache.v_data, cache.v_scale, cache.global_scale[1]),
    ):
        d = data[pages, :, offs]
        s = None if scale is None else scale[pages, :, offs]
        out.append(dequantize_rows(d, s, cache.dtype, g))
    return out[0], out[1]


def _context(b: int, kv: PagedKV) -> tuple[torch.Tensor, torch.Tensor]:
    """Request ``b``'s whole context in ``kv``: its main-pool tokens, then its tail tokens."""
    k, v = gather_kv(kv.cache, kv.page_table[b], int(kv.lens[b]))
    tail, tail_table, tail_lens = kv.tail, kv.tail_page_table, kv.tail_lens
    if tail is not None and tail_table is not None and tail_lens is not None and int(tail_lens[b]) > 0:
        tk, tv = gather_kv(tail, tail_table[b], int(tail_lens[b]))
        k, v = torch.cat((k, tk)), torch.cat((v, tv))
    return k, v


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float, mask: torch.Tensor | None
) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] (float32) -> [Tq, Hq, D] float32."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", p, v)


def decode_ref(q: torch.Tensor, kv: PagedKV, sm_scale: float) -> torch.Tensor:
    """One query token per request: ``q [B, Hq, D]`` -> ``[B, Hq, D]`` over each request's whole context."""
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        k, v = _context(b, kv)
        out[b] = _attend(q[b : b + 1], k, v, sm_scale, None)[0].to(q.dtype)
    return out


def extend_ref(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: PagedKV, sm_scale: float
) -> torch.Tensor:
    """A chunk of new tokens per request attends to its cached prefix plus, causally, to itself.

    ``q [T, Hq, D]``, ``k_new/v_new [T, Hkv, D]`` (fresh, unquantized), ``kv.cu_seqlens [B+1]`` splits T
    into requests. The prefix is ``kv.lens[b]`` main-pool tokens then ``kv.tail_lens[b]`` tail tokens; the
    chunk's own K/V are used as given (never read back from the cache).
    """
    if kv.cu_seqlens is None:
        raise ValueError("an extend's view needs cu_seqlens")
    cu = kv.cu_seqlens
    out = torch.empty_like(q)
    for b in range(cu.numel() - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e == s:
            continue
        pk, pv = _context(b, kv)
        k = torch.cat((pk, k_new[s:e].float()))
        v = torch.cat((pv, v_new[s:e].float()))
        n, c = pk.shape[0], e - s
        mask = torch.ones(c, n + c, dtype=torch.bool, device=q.device)
        mask[:, n:] = torch.tril(torch.ones(c, c, dtype=torch.bool, device=q.device))
        out[s:e] = _attend(q[s:e], k, v, sm_scale, mask).to(q.dtype)
    return out


def demote_pages_ref(moves: TailDemotion, four_over_six: bool = False) -> None:
    """Quantize whole tail pages ``moves.src_pages [N]`` into main-pool pages ``moves.dst_pages [N]`` (same
    page size); pairs with ``dst < 0`` are skipped (empty slots of a fixed-size list, as CUDA graphs pass
    them)."""
    tail, cache = moves.tail, moves.cache
    if tail.page_size != cache.page_size:
        raise ValueError("tail and main pool must share the page size")
    keep = moves.dst_pages >= 0
    src, dst = moves.src_pages[keep].long(), moves.dst_pages[keep].long()
    for t_data, data, scale, g in (
        (tail.k_data, cache.k_data, cache.k_scale, cache.global_scale[0]),
        (tail.v_data, cache.v_data, cache.v_scale, cache.global_scale[1]),
    ):
        qd, qs = _quantize(t_data[src], cache, g, four_over_six)
        data[dst] = qd
        if scale is not None:
            scale[dst] = qs
