"""``PagedKV``: one layer's paged KV for one batch, as the attention kernels read it; ``TailDemotion``: the
tail pages one demotion quantizes into the main pool."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nibblekv.formats.layer_kv import LayerKV


@dataclass(frozen=True)
class PagedKV:
    """The view one attention call reads: a layer's pools and the batch's page tables and lengths.

    ``cache``: the layer's main pool; ``page_table [B, >= pages]`` (int32 / int64) each request's main
    pages and ``lens [B]`` (int32) the main-pool tokens it reads. ``tail`` (an unquantized pool, optional)
    with ``tail_page_table`` / ``tail_lens`` likewise. A sink page is no field of its own: the attention
    backend reads it from its bf16 copy, so it leads the tail's page row and counts in ``tail_lens`` (the
    main row starts past it). ``active`` (int32 ``[1]`` on the device) / ``min_active`` (host int): a CUDA
    graph replayed with padding rows -- only the first ``*active`` rows are requests, and the graph serves
    batches of at least ``min_active``. ``cu_seqlens`` (int32 ``[B + 1]``, an extend's view only) splits the
    batch's new tokens into requests (``lens`` / ``tail_lens`` are then the cached prefix's); ``max_chunk``
    (host int >= the longest chunk, optional) spares the extend launchers a device sync. NOTE: a frozen
    record of existing tensors (a CUDA graph's static buffers under capture); building one per layer and step
    costs no device work.
    """

    cache: LayerKV
    page_table: torch.Tensor
    lens: torch.Tensor
    tail: LayerKV | None = None
    tail_page_table: torch.Tensor | None = None
    tail_lens: torch.Tensor | None = None
    active: torch.Tensor | None = None
    min_active: int | None = None
    cu_seqlens: torch.Tensor | None = None
    max_chunk: int | None = None

    @property
    def has_tail(self) -> bool:
        """Whether the view reads a tail pool (its pages and lengths given)."""
        return self.tail is not None and self.tail_page_table is not None and self.tail_lens is not None


@dataclass(frozen=True)
class TailDemotion:
    """One layer's demotion: the tail pool's pages ``src_pages [N]`` quantized into the main pool ``cache``'s
    pages ``dst_pages [N]`` (same page size; a pair with ``dst < 0`` is an empty slot of a fixed-size list, as
    CUDA graphs pass them, and is skipped)."""

    tail: LayerKV
    src_pages: torch.Tensor
    cache: LayerKV
    dst_pages: torch.Tensor


__all__ = ["PagedKV", "TailDemotion"]
