"""``PagedKV``: one layer's paged KV for one batch, as the attention kernels read it."""

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
    batches of at least ``min_active``. NOTE: a frozen record of existing tensors (a CUDA graph's static
    buffers under capture); building one per layer and step costs no device work.
    """

    cache: LayerKV
    page_table: torch.Tensor
    lens: torch.Tensor
    tail: LayerKV | None = None
    tail_page_table: torch.Tensor | None = None
    tail_lens: torch.Tensor | None = None
    active: torch.Tensor | None = None
    min_active: int | None = None

    @property
    def has_tail(self) -> bool:
        """Whether the view reads a tail pool (its pages and lengths given)."""
        return self.tail is not None and self.tail_page_table is not None and self.tail_lens is not None


__all__ = ["PagedKV"]
