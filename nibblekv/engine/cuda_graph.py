"""CUDA graphs for decode: one captured forward + logits per batch size, replayed on static buffers.

A batch of ``bs`` requests replays the smallest captured size ``>= bs``; the extra rows are padding
that reads one token of the scratch page 0 and writes nowhere (slot -1). Tail-page demotion runs inside
the graph over one slot per row (empty slots skipped), not eagerly before the replay (one Python launch
per layer and step while requests age pages: most steps at large batches). A hybrid model's linear layers
read and write each row's state slot inside the graph too; padding rows use the pool's scratch slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from nibblekv.attention.paged import PagedAttentionBackend, PagedMetadata, to_device
from nibblekv.cache.page_table import PageTable
from nibblekv.cache.pool import KVPool
from nibblekv.cache.state_pool import LinearStateBatch, StatePool
from nibblekv.config import cuda_graph_batch_limit
from nibblekv.engine.request import fill_placeholders
from nibblekv.model import CausalLM

logger = logging.getLogger("nibblekv")


def capture_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 up to ``max_bs`` (and ``max_bs`` itself)."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs] + list(range(16, max_bs + 1, 8))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def graph_sizes(cuda_graph_bs: Sequence[int] | None, cuda_graph_max_bs: int | None, max_running: int) -> list[int]:
    """The batch sizes to capture: ``--cuda-graph-bs`` (clamped to ``max_running``) if given, else
    :func:`capture_sizes` up to ``config.cuda_graph_batch_limit``."""
    if cuda_graph_bs:
        return sorted({min(s, max_running) for s in cuda_graph_bs})
    return capture_sizes(cuda_graph_batch_limit(cuda_graph_max_bs, max_running))


class CudaGraphRunner:
    """Captures the decode forward for each of ``sizes`` (:func:`graph_sizes`) and replays it."""

    def __init__(
        self,
        model: CausalLM,
        backend: PagedAttentionBackend,
        pool: KVPool,
        table: PageTable,
        sizes: Sequence[int],
        capture: bool = True,
        states: StatePool | None = None,
    ) -> None:
        """``capture=False``: no graphs -- each replay runs the same padded static-buffer forward eagerly
        (what CPU tests check the padding, ``active`` rows and in-forward demotion slots with).
        ``states``: a hybrid model's linear-attention state pool (the batch's ``state_slots`` list)."""
        self.model = model
        self.states = states
        self.capture = capture
        self.backend = backend
        self.pool = pool
        self.table = table
        self.sizes = sorted(set(sizes))
        dev = model.device
        n = self.sizes[-1]
        i32: dict = {"dtype": torch.int32, "device": dev}
        i64: dict = {"dtype": torch.int64, "device": dev}
        self.input_ids, self.positions = torch.empty(n, **i64), torch.empty(n, **i64)
        self.page_table = torch.empty(n, table.main.shape[1], **i32)
        self.tail_page_table = torch.empty(n, table.tail.shape[1], **i32)
        self.main_lens, self.tail_lens = torch.empty(n, **i32), torch.empty(n, **i32)
        self.main_slots, self.tail_slots = torch.empty(n, **i64), torch.empty(n, **i64)
        self.active = torch.ones(1, **i32)  # real rows of the replayed batch (the rest is padding)
        # Tail pages to demote this step, one slot per row (a decode step ages at most one page a request):
        # demoted inside the graph, each layer before its write; dst -1 = an empty slot (src 0: scratch)
        self.demote_src, self.demote_dst = torch.zeros(n, **i64), torch.full((n,), -1, **i64)
        self.state_slots = torch.zeros(n, **i64)  # hybrid models: each row's state slot (padding: scratch)
        self._pad_buffers()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._folded = model.output_rotation_folded
        if capture:
            self.mempool = torch.cuda.graph_pool_handle()
            self._capture_all()

    def fits(self, bs: int) -> bool:
        return bs <= self.sizes[-1]

    def _meta(self, bs: int) -> PagedMetadata:
        rows = bs if self.pool.tail else 0  # no tail pool: nothing ever demotes
        return PagedMetadata(
            is_decode=True,
            page_table=self.page_table[:bs],
            main_lens=self.main_lens[:bs],
            tail_page_table=self.tail_page_table[:bs],
            tail_lens=self.tail_lens[:bs],
            main_slots=self.main_slots[:bs],
            tail_slots=self.tail_slots[:bs],
            cu_seqlens=None,
            demote_src=self.demote_src[:rows],
            demote_dst=self.demote_dst[:rows],
            active=self.active,
            min_active=self.min_active(bs),
        )

    def min_active(self, size: int) -> int:
        """The fewest real rows a replay of the graph of ``size`` rows carries (the next smaller size + 1)."""
        i = self.sizes.index(size)
        return self.sizes[i - 1] + 1 if i else 1

    @torch.inference_mode()
    def _capture_all(self) -> None:
        # Largest first, so smaller graphs reuse its memory pool.
        t0 = time.perf_counter()
        for bs in reversed(self.sizes):
            self.backend.bind(self._meta(bs))
            self.active.fill_(bs)
            for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                self._forward(bs)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                self.logits[bs] = self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info(
            "Capture cuda graph end. Time elapsed: %.1f s, bs: %s", time.perf_counter() - t0, self.sizes
        )

    def release(self) -> None:
        """Free every captured graph and its memory pool (idempotent).

        NOTE: under TP the graphs hold captured NCCL all-reduces, and NCCL's teardown
        (``destroy_process_group``) blocks for good while such a graph is alive (pytorch#115388): every
        rank releases its graphs before it leaves the group.
        """
        if not self.capture:
            return
        torch.cuda.synchronize()
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.logits.clear()
        torch.cuda.synchronize()

    def _pad_buffers(self) -> None:
        """Every row a padding row (see ``_fill``): token 0 at position 0 reading one token of scratch
        page 0, writing nowhere. What captures run on."""
        for buf in (self.input_ids, self.positions, self.page_table, self.tail_page_table, self.tail_lens):
            buf.zero_()
        self.main_lens.fill_(1)
        self.main_slots.fill_(-1)
        self.tail_slots.fill_(-1)
        self.demote_src.zero_()
        self.demote_dst.fill_(-1)
        self.state_slots.fill_(self._scratch_slot)

    def _recapture(self) -> None:
        """Capture again after another engine folded a rotation into the shared model's o_proj (the old
        graphs lack the layer's basis change). The buffers go back to padding rows first: the warm-up
        forwards must not write K/V into pages that now belong to other requests."""
        logger.info("model's o_proj changed (rotation folded by another engine): re-capturing cuda graphs")
        self.graphs.clear()
        self.logits.clear()
        torch.cuda.synchronize()
        self._pad_buffers()
        self._folded = self.model.output_rotation_folded
        # NOTE: a fresh pool: the old one lives on with no graph (use count 0) while any tensor it allocated
        # does, and capturing into it again failed torch's allocator assert (use_count > 0) in a GPU test
        self.mempool = torch.cuda.graph_pool_handle()
        self._capture_all()

    @property
    def _scratch_slot(self) -> int:
        return self.states.scratch_slot if self.states is not None else 0

    def _forward(self, bs: int) -> torch.Tensor:
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        if self.states is None:
            hidden = self.model.forward(ids, pos, self.backend)
        else:
            states = LinearStateBatch(list(range(bs + 1)), True, self.states, self.state_slots[:bs])
            hidden = self.model.forward(ids, pos, self.backend, states)  # type: ignore[call-arg]
        return self.model.compute_logits(hidden)

    def replay(
        self, lists: dict[str, list[int]], bs: int, prev_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run the batch described by the runner's ``lists``; returns logits ``[bs, vocab]``.
        ``prev_tokens``: what placeholder input ids stand for (``request.fill_placeholders``)."""
        if self.capture and self.model.output_rotation_folded != self._folded:
            self._recapture()
        size = next(s for s in self.sizes if s >= bs)
        src, dst = lists["demote_src"], lists["demote_dst"]
        if len(src) > size:  # NOTE: not expected from decode steps (<= 1 page a request); kept correct anyway
            self._demote(src, dst)
            src, dst = [], []
        self._fill(lists, bs, size, src, dst)
        if prev_tokens is not None:
            ids = self.input_ids[:size]
            ids.copy_(fill_placeholders(ids, prev_tokens))
        if not self.capture:
            self.backend.bind(self._meta(size))
            with torch.inference_mode():
                return self._forward(size)[:bs]
        self.graphs[size].replay()
        return self.logits[size][:bs]

    def _fill(self, lists: dict[str, list[int]], bs: int, size: int, src: list[int], dst: list[int]) -> None:
        pad = size - bs
        # Padding rows: token 0 at position 0, reading one token of the scratch page, writing nowhere.
        padded = {
            "input_ids": lists["input_ids"] + [0] * pad,
            "positions": lists["positions"] + [0] * pad,
            "main_lens": lists["main_lens"] + [1] * pad,
            "tail_lens": lists["tail_lens"] + [0] * pad,
            "main_slots": lists["main_slots"] + [-1] * pad,
            "tail_slots": lists["tail_slots"] + [-1] * pad,
            "rows": lists["rows"] + [0] * pad,
            "active": [bs],
            "demote_src": src + [0] * (size - len(src)),
            "demote_dst": dst + [-1] * (size - len(dst)),
        }
        names: tuple[str, ...] = (
            "input_ids", "positions", "main_lens", "tail_lens", "main_slots", "tail_slots", "active"
        )  # fmt: skip
        if self.states is not None:
            padded["state_slots"] = lists["state_slots"] + [self._scratch_slot] * pad
            names = (*names, "state_slots")
        d = to_device(padded, self.input_ids.device)
        for name in (*names, "demote_src", "demote_dst"):
            getattr(self, name)[:size].copy_(d[name])
        torch.index_select(self.table.main, 0, d["rows"], out=self.page_table[:size])
        torch.index_select(self.table.tail, 0, d["rows"], out=self.tail_page_table[:size])

    def _demote(self, src: list[int], dst: list[int]) -> None:
        if not src:
            return
        d = to_device({"src": src, "dst": dst}, self.input_ids.device)
        for layer in range(len(self.pool.main)):
            self.backend.demote(layer, d["src"], d["dst"])
