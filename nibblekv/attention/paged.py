"""The paged attention backend: stores K/V into the tiered pool and attends over it.

Per layer, for one forward (see ``nibblekv.cache.manager`` for the tail rule):

* extend (a prefill chunk, with or without a cached prefix): demote aged tail pages, attend over the
  prefix as it stands after demotion plus the chunk's fresh K/V, then write the chunk's K/V, each
  token into the main or the tail pool (two ``write_kv`` calls, slot -1 = "the other pool");
* decode (one token per request): demote, write the token, then attend over everything, reading the
  quantized pages and dequantizing in the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nibblekv.attention.backend import AttentionBackend
from nibblekv.cache.manager import Growth, RequestPages
from nibblekv.cache.pool import KVPool
from nibblekv.kernels import LayerKV, decode_attention, demote_pages, extend_attention, write_kv


@dataclass
class PagedMetadata:
    """Device tensors describing one batch (built by :func:`build_metadata` or the graph runner).

    ``page_table [B, Pm]`` / ``tail_page_table [B, Pt]`` (int32) are each request's pages after this
    step's growth; ``main_lens`` / ``tail_lens [B]`` (int32) the tokens to read from each pool: the
    prefix for extend, the whole context for decode. ``main_slots`` / ``tail_slots [T]`` (int64)
    place each new token (-1: it goes to the other pool). ``cu_seqlens [B+1]`` splits extend tokens.
    """

    is_decode: bool
    page_table: torch.Tensor
    main_lens: torch.Tensor
    tail_page_table: torch.Tensor
    tail_lens: torch.Tensor
    main_slots: torch.Tensor
    tail_slots: torch.Tensor
    cu_seqlens: torch.Tensor | None
    demote_src: torch.Tensor
    demote_dst: torch.Tensor
    demote_in_forward: bool = True  # False when the caller demotes before the forward (CUDA graphs)


def _pad_rows(rows: Sequence[Sequence[int]], width: int | None = None) -> list[list[int]]:
    # NOTE: padding uses the scratch page 0, so a kernel never sees an out-of-range page id.
    w = max([len(r) for r in rows] + [1]) if width is None else width
    return [list(r) + [0] * (w - len(r)) for r in rows]


def host_metadata(
    batch: Sequence[tuple[RequestPages, Growth]], is_decode: bool, page_size: int
) -> dict[str, list]:
    """The batch's metadata as Python lists (the graph runner pads these into static buffers)."""
    main_rows, tail_rows, main_lens, tail_lens = [], [], [], []
    main_slots: list[int] = []
    tail_slots: list[int] = []
    cu = [0]
    src: list[int] = []
    dst: list[int] = []
    for pages, g in batch:
        main_rows.append(pages.main)
        tail_rows.append(pages.tail)
        read_len = g.new_len if is_decode else g.old_len
        main_len = min(g.num_main, read_len)
        main_lens.append(main_len)
        tail_lens.append(read_len - main_len)
        for pos in range(g.old_len, g.new_len):
            in_main, slot = pages.slot(pos, page_size)
            main_slots.append(slot if in_main else -1)
            tail_slots.append(-1 if in_main else slot)
        cu.append(cu[-1] + g.new_len - g.old_len)
        src.extend(g.demote_src)
        dst.extend(g.demote_dst)
    return {
        "page_table": main_rows,
        "tail_page_table": tail_rows,
        "main_lens": main_lens,
        "tail_lens": tail_lens,
        "main_slots": main_slots,
        "tail_slots": tail_slots,
        "cu_seqlens": cu,
        "demote_src": src,
        "demote_dst": dst,
    }


def build_metadata(
    batch: Sequence[tuple[RequestPages, Growth]], is_decode: bool, page_size: int, device: torch.device
) -> PagedMetadata:
    """Eager-mode metadata: tensors sized to this batch."""
    h = host_metadata(batch, is_decode, page_size)

    def i32(x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32, device=device)

    def i64(x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int64, device=device)

    return PagedMetadata(
        is_decode=is_decode,
        page_table=i32(_pad_rows(h["page_table"])),
        main_lens=i32(h["main_lens"]),
        tail_page_table=i32(_pad_rows(h["tail_page_table"])),
        tail_lens=i32(h["tail_lens"]),
        main_slots=i64(h["main_slots"]),
        tail_slots=i64(h["tail_slots"]),
        cu_seqlens=None if is_decode else i32(h["cu_seqlens"]),
        demote_src=i64(h["demote_src"]),
        demote_dst=i64(h["demote_dst"]),
    )


class PagedAttentionBackend(AttentionBackend):
    """:class:`AttentionBackend` over a :class:`KVPool`; :meth:`bind` sets up each forward."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.sm_scale = pool.spec.head_dim**-0.5
        self.meta: PagedMetadata | None = None

    def bind(self, meta: PagedMetadata) -> None:
        self.meta = meta

    def demote_layer(self, layer_id: int) -> None:
        """Quantize this step's aged tail pages into their main pages (no-op when there are none)."""
        m = self.meta
        assert m is not None
        if m.demote_src.numel():
            demote_pages(self.pool.tail[layer_id], m.demote_src, self.pool.main[layer_id], m.demote_dst)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = self.meta
        assert m is not None, "bind() metadata before the forward"
        main = self.pool.main[layer_id]
        tail = self.pool.tail[layer_id] if self.pool.tail else None
        if m.demote_in_forward:
            self.demote_layer(layer_id)
        if m.is_decode:
            self._write(k, v, main, tail)
            return decode_attention(
                q, main, m.page_table, m.main_lens, self.sm_scale, tail, m.tail_page_table, m.tail_lens
            )
        assert m.cu_seqlens is not None
        out = extend_attention(
            q, k, v, m.cu_seqlens, main, m.page_table, m.main_lens, self.sm_scale, tail, m.tail_page_table, m.tail_lens
        )
        # NOTE: written after attending: the chunk attends to its fresh K/V, never to the stored copy.
        self._write(k, v, main, tail)
        return out

    def _write(self, k: torch.Tensor, v: torch.Tensor, main: LayerKV, tail: LayerKV | None) -> None:
        m = self.meta
        assert m is not None
        write_kv(k, v, main, m.main_slots)
        if tail is not None:
            write_kv(k, v, tail, m.tail_slots)
