"""CUDA graphs for decode: one captured forward + logits per batch size, replayed on static buffers.

A batch of ``bs`` requests replays the smallest captured size ``>= bs``; the extra rows are padding
that reads one token of the scratch page 0 and writes nowhere (slot -1). Tail-page demotion has a
variable size, so it runs eagerly before the replay, for every layer (the graph never demotes).
"""

from __future__ import annotations

import torch

from nibblekv.attention.paged import PagedAttentionBackend, PagedMetadata
from nibblekv.cache.manager import cdiv
from nibblekv.cache.pool import KVPool
from nibblekv.kernels import demote_pages
from nibblekv.model import CausalLM


def capture_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_bs`` (and ``max_bs`` itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs] + list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class CudaGraphRunner:
    """Captures the decode forward for :func:`capture_sizes` and replays it."""

    def __init__(
        self, model: CausalLM, backend: PagedAttentionBackend, pool: KVPool, max_bs: int, context_len: int
    ) -> None:
        self.model = model
        self.backend = backend
        self.pool = pool
        self.sizes = capture_sizes(max_bs)
        dev = model.device
        p = pool.page_size
        width = cdiv(context_len, p) + 1
        tail_width = max(1, pool.recent_window // p + 1)
        n = self.sizes[-1]
        i32: dict = {"dtype": torch.int32, "device": dev}
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.page_table = torch.zeros(n, width, **i32)
        self.tail_page_table = torch.zeros(n, tail_width, **i32)
        self.main_lens = torch.ones(n, **i32)
        self.tail_lens = torch.zeros(n, **i32)
        self.main_slots = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.tail_slots = torch.full((n,), -1, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()
        self._capture_all()

    def fits(self, bs: int) -> bool:
        return bs <= self.sizes[-1]

    def _meta(self, bs: int) -> PagedMetadata:
        empty = torch.zeros(0, dtype=torch.int64, device=self.input_ids.device)
        return PagedMetadata(
            is_decode=True,
            page_table=self.page_table[:bs],
            main_lens=self.main_lens[:bs],
            tail_page_table=self.tail_page_table[:bs],
            tail_lens=self.tail_lens[:bs],
            main_slots=self.main_slots[:bs],
            tail_slots=self.tail_slots[:bs],
            cu_seqlens=None,
            demote_src=empty,
            demote_dst=empty,
            demote_in_forward=False,
        )

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # Largest first, so smaller graphs reuse its memory pool.
        for bs in reversed(self.sizes):
            self.backend.bind(self._meta(bs))
            for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                self._forward(bs)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                self.logits[bs] = self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def _forward(self, bs: int) -> torch.Tensor:
        hidden = self.model.forward(self.input_ids[:bs], self.positions[:bs], self.backend)
        return self.model.compute_logits(hidden)

    def replay(self, h: dict[str, list], input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the batch described by ``host_metadata`` output ``h``; returns logits ``[bs, vocab]``."""
        bs = input_ids.shape[0]
        size = next(s for s in self.sizes if s >= bs)
        self._demote(h["demote_src"], h["demote_dst"])
        self._fill(h, input_ids, positions, bs, size)
        self.graphs[size].replay()
        return self.logits[size][:bs]

    def _fill(
        self, h: dict[str, list], input_ids: torch.Tensor, positions: torch.Tensor, bs: int, size: int
    ) -> None:
        dev = self.input_ids.device
        self.input_ids[:bs].copy_(input_ids)
        self.positions[:bs].copy_(positions)
        self.input_ids[bs:size].zero_()
        self.positions[bs:size].zero_()
        for buf, rows in ((self.page_table, h["page_table"]), (self.tail_page_table, h["tail_page_table"])):
            host = torch.zeros(size, buf.shape[1], dtype=torch.int32)
            for i, r in enumerate(rows):
                host[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
            buf[:size].copy_(host.to(dev, non_blocking=True))
        pad = size - bs
        self.main_lens[:size].copy_(torch.tensor(h["main_lens"] + [1] * pad, dtype=torch.int32).to(dev))
        self.tail_lens[:size].copy_(torch.tensor(h["tail_lens"] + [0] * pad, dtype=torch.int32).to(dev))
        self.main_slots[:size].copy_(torch.tensor(h["main_slots"] + [-1] * pad).to(dev))
        self.tail_slots[:size].copy_(torch.tensor(h["tail_slots"] + [-1] * pad).to(dev))

    def _demote(self, src: list[int], dst: list[int]) -> None:
        if not src:
            return
        dev = self.input_ids.device
        s = torch.tensor(src, dtype=torch.int64, device=dev)
        d = torch.tensor(dst, dtype=torch.int64, device=dev)
        for layer in range(len(self.pool.main)):
            demote_pages(self.pool.tail[layer], s, self.pool.main[layer], d)
