"""The paged attention backend: stores K/V into the tiered pool and attends over it.

Per layer, for one forward (see ``nibblekv.cache.manager`` for the tail rule):

* extend (a prefill chunk, with or without a cached prefix): attend over the prefix as it stood
  before this step's growth (its aged tail pages still in bf16) plus the chunk's fresh K/V, then
  demote the aged tail pages, then write the chunk's K/V, each token into the main or the tail pool
  (two ``write_kv`` calls, slot -1 = "the other pool");
* decode (one token per request): demote, write the token, then attend over everything, reading the
  quantized pages and dequantizing in the kernel.
"""

from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nibblekv.attention.backend import AttentionBackend
from nibblekv.cache.host_tier import Transfer
from nibblekv.cache.manager import Growth
from nibblekv.cache.page_table import PageTable
from nibblekv.cache.pages import RequestPages
from nibblekv.cache.pool import KVPool
from nibblekv.formats.kv_view import PagedKV, TailDemotion
from nibblekv.formats.layer_kv import LayerKV
from nibblekv.kernels import decode_attention, demote_pages, extend_attention, write_kv


def hadamard_matrix(
    d: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The normalized ``d x d`` Sylvester Hadamard matrix (d a power of two): symmetric and orthogonal."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"--kv-hadamard needs a power-of-two head_dim, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:  # [[H, H], [H, -H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / d**0.5).to(device=device, dtype=dtype)


@dataclass
class PagedMetadata:
    """Device tensors describing one batch (built by :func:`build_metadata` or the graph runner).

    ``page_table [B, Pm]`` (int32) is each request's main pages after this step's growth;
    ``tail_page_table [B, Pt]`` its tail pages after the growth (decode) or before it (extend: the
    prefix's bf16 pages, see ``Growth.old_tail``); with a sink page, the main row starts at page 1
    and the sink page leads the tail row (``RequestPages.attn_main`` / ``attn_tail``); ``main_lens`` / ``tail_lens [B]`` (int32) the
    tokens to read from each pool: the prefix for extend, the whole context for decode. ``main_slots`` / ``tail_slots [T]`` (int64)
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
    # extend: the longest chunk as a host int (else every layer's extend reads it back: a device sync)
    max_chunk: int | None = None
    # decode under CUDA graphs: rows past ``active`` (int32 [1], on the device) are padding, and the graph
    # serves batches of at least ``min_active`` rows (decode_attention sizes its split-K from them)
    active: torch.Tensor | None = None
    min_active: int | None = None


def host_metadata(
    batch: Sequence[tuple[RequestPages, Growth]], is_decode: bool, page_size: int, tail_pool: bool = False
) -> dict[str, list[int]]:
    """The batch's per-request lengths, per-token slots and demotions as Python lists.

    ``tail_pool``: the pool has a bf16 tail. Then a decode token is always the newest of its request's
    window, so it lands in a tail page; checked here because the backend relies on it (it skips the
    main-pool write of decode steps, see ``PagedAttentionBackend._write``)."""
    if is_decode and tail_pool:
        return _decode_tail_metadata(batch, page_size)
    # NOTE: local lists, no per-token dict lookups: this runs for every request of every step
    main_lens: list[int] = []
    tail_lens: list[int] = []
    main_slots: list[int] = []
    tail_slots: list[int] = []
    cu_seqlens, demote_src, demote_dst = [0], [], []
    h = {"main_lens": main_lens, "tail_lens": tail_lens, "main_slots": main_slots, "tail_slots": tail_slots}
    h.update(cu_seqlens=cu_seqlens, demote_src=demote_src, demote_dst=demote_dst)
    if not is_decode:  # the prefix's tail pages, [B, width] row-major, padded with scratch page 0
        prefix_tail = h["prefix_tail"] = []
        width = max([len(_prefix_tail(g)) for _, g in batch] + [1])
    for pages, g in batch:
        main_len, tail_len = _read_lens(g, is_decode, page_size)
        main_lens.append(main_len)
        tail_lens.append(tail_len)
        if not is_decode:
            rows = _prefix_tail(g)
            prefix_tail.extend(rows + [0] * (width - len(rows)))
        for pos in range(g.old_len, g.new_len):
            in_main, slot = pages.slot(pos, page_size)
            if in_main and is_decode and tail_pool:
                raise RuntimeError(f"decode token at position {pos} maps to a main page despite the bf16 tail")
            main_slots.append(slot if in_main else -1)
            tail_slots.append(-1 if in_main else slot)
            if g.sink is not None and pos < page_size:  # NOTE: only in the growth that made the sink
                tail_slots[-1] = g.sink * page_size + pos  # page 0's bf16 copy, beside main
        cu_seqlens.append(cu_seqlens[-1] + g.new_len - g.old_len)
        if g.demote_src:
            demote_src.extend(g.demote_src)
            demote_dst.extend(g.demote_dst)
    return h


def _decode_tail_metadata(
    batch: Sequence[tuple[RequestPages, Growth]], page_size: int
) -> dict[str, list[int]]:
    """:func:`host_metadata` of a decode batch over a pool with a bf16 tail, inlined: one token per request,
    which lands in a tail page (checked). NOTE: the same lists as the general loop, ~2x faster (it runs for
    every request of every decode step)."""
    p = page_size
    bad = [(pages, g) for pages, g in batch if g.new_len != g.old_len + 1 or g.old_len < pages.num_main]
    if bad:
        pages, g = bad[0]
        if g.new_len != g.old_len + 1:
            raise RuntimeError(f"a decode growth of {g.new_len - g.old_len} tokens (position {g.old_len})")
        raise RuntimeError(f"decode token at position {g.old_len} maps to a main page despite the bf16 tail")
    # NOTE: comprehensions, not appends: ~1 us a Python call on the H200 host's CPU, 256 requests a step.
    # With a sink, page 0 is read from its bf16 copy in the tail pool: P tokens move from main to tail.
    sink = [0 if g.sink is None else p for _, g in batch]
    main = [min(g.num_main, g.new_len) for _, g in batch]
    demoting = [g for _, g in batch if g.demote_src]
    return {  # NOTE: host_metadata's keys, in its order (to_device lays the lists out in it)
        "main_lens": [m - s for m, s in zip(main, sink)],
        "tail_lens": [g.new_len - m + s for (_, g), m, s in zip(batch, main, sink)],
        "main_slots": [-1] * len(batch),
        "tail_slots": [
            g.sink * p + g.old_len if g.sink is not None and g.old_len < p
            else pages.tail[(g.old_len - pages.num_main) // p] * p + g.old_len % p
            for pages, g in batch
        ],
        "cu_seqlens": list(range(len(batch) + 1)),
        "demote_src": [page for g in demoting for page in g.demote_src],
        "demote_dst": [page for g in demoting for page in g.demote_dst],
    }  # fmt: skip


def _read_lens(g: Growth, is_decode: bool, page_size: int) -> tuple[int, int]:
    """(main, tail) tokens attention reads: the whole context (decode) or the cached prefix (extend).

    NOTE: with a sink page, main page 0 is read from the tail pool instead: the page table's main row
    starts at page 1 and the sink leads the tail row (key order does not matter to attention).
    """
    if is_decode:
        main_len, sink = min(g.num_main, g.new_len), g.sink
    else:
        main_len, sink = g.prefix_main, g.old_sink
    tail_len = (g.new_len if is_decode else g.old_len) - main_len
    if sink is not None:
        main_len, tail_len = main_len - page_size, tail_len + page_size
    return main_len, tail_len


def _prefix_tail(g: Growth) -> list[int]:
    """The tail pages an extend's prefix is read from: the sink page (if any), then ``old_tail``."""
    return list(g.old_tail) if g.old_sink is None else [g.old_sink, *g.old_tail]


def to_device(lists: dict[str, list[int]], device: torch.device) -> dict[str, torch.Tensor]:
    """int64 tensors of ``lists`` on ``device`` through ONE host-to-device copy (views of one buffer).

    NOTE: every view starts 16-byte aligned (each list padded to an even length): Triton builds a kernel
    again for each pointer argument that is or is not 16-byte aligned, so views at odd offsets (slots,
    demotion pages) made the first real batches compile ``_store_rows_kernel`` builds the warm-up had not
    (four in an offline-throughput run of SmolLM2 on the H200).
    """
    sizes = [len(v) for v in lists.values()]
    padded = [n + (n & 1) for n in sizes]
    buf = array.array("q")  # NOTE: ~2x faster than torch.tensor(list) (150 -> 77 us for 2.5K ints)
    for v in lists.values():
        buf.extend(v)
        if len(v) & 1:
            buf.append(0)
    flat = torch.frombuffer(buf, dtype=torch.int64) if buf else torch.zeros(0, dtype=torch.int64)
    views = flat.to(device, non_blocking=True).split(padded)
    return {name: view[:n] for name, view, n in zip(lists, views, sizes)}


def longest_chunk(cu_seqlens: Sequence[int] | None) -> int | None:
    """The longest chunk of host ``cu_seqlens`` (None without one)."""
    if not cu_seqlens or len(cu_seqlens) < 2:
        return None
    return max(b - a for a, b in itertools.pairwise(cu_seqlens))


def build_metadata(
    d: dict[str, torch.Tensor],
    rows: torch.Tensor,
    is_decode: bool,
    table: PageTable,
    cu_seqlens: Sequence[int] | None = None,
) -> PagedMetadata:
    """Eager-mode metadata from :func:`to_device` output ``d`` and the batch's page-table ``rows``
    (``cu_seqlens``: the host list of :func:`host_metadata`, for the extend's longest chunk)."""
    if is_decode:
        tail_table = table.tail.index_select(0, rows)
    else:
        bsz = d["main_lens"].numel()
        tail_table = d["prefix_tail"].view(bsz, -1).to(torch.int32)
    return PagedMetadata(
        is_decode=is_decode,
        page_table=table.main.index_select(0, rows),
        main_lens=d["main_lens"].to(torch.int32),
        tail_page_table=tail_table,
        tail_lens=d["tail_lens"].to(torch.int32),
        main_slots=d["main_slots"],
        tail_slots=d["tail_slots"],
        cu_seqlens=None if is_decode else d["cu_seqlens"].to(torch.int32),
        demote_src=d["demote_src"],
        demote_dst=d["demote_dst"],
        max_chunk=longest_chunk(cu_seqlens),
    )


class PagedAttentionBackend(AttentionBackend):
    """:class:`AttentionBackend` over a :class:`KVPool`; :meth:`bind` sets up each forward."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.sm_scale = pool.spec.head_dim**-0.5
        self.meta: PagedMetadata | None = None
        # Per layer, the bound batch's paged-KV view the kernels read (built by bind, once a step)
        self.views: list[PagedKV] = []
        # --kv-hadamard: q, k, v are rotated by H before the cache ops and the output rotated back
        # (H orthogonal and symmetric: scores and outputs are unchanged, only what is stored differs).
        if pool.spec.hadamard:
            dtype = pool.spec.tail_layout.torch_dtype  # the model's dtype
            self.qkv_rotation = hadamard_matrix(pool.spec.head_dim, pool.device, dtype)
        self.four_over_six = pool.spec.four_over_six
        # Host-tier copies into pages this forward reads; layer i waits for layer i's copy only.
        self.loads: Sequence[Transfer] = ()

    def plan(self, batch: Sequence[tuple[RequestPages, Growth]], is_decode: bool) -> dict[str, list[int]]:
        """One step's host lists (per-request lengths, per-token slots, demotions; :func:`host_metadata`)
        under this pool's page size and tail rule.

        NOTE: host lists, not tensors: the engine builds them while the previous step runs (overlap
        schedule) and ships them with its own inputs in one host-to-device copy; :meth:`begin` turns that
        copy into the step's bound view."""
        return host_metadata(batch, is_decode, self.pool.page_size, bool(self.pool.tail))

    def begin(
        self,
        d: dict[str, torch.Tensor],
        is_decode: bool,
        table: PageTable,
        cu_seqlens: Sequence[int] | None = None,
    ) -> None:
        """Bind the step whose :meth:`plan` lists are on the device as ``d`` (``d["rows"]``: the batch's rows of
        ``table``; ``cu_seqlens``: the host list, for an extend's longest chunk)."""
        self.bind(build_metadata(d, d["rows"], is_decode, table, cu_seqlens))

    def bind(self, meta: PagedMetadata) -> None:
        """Set up the next forward: ``meta`` and each layer's ``PagedKV`` view of it (frozen records of the
        pools' and ``meta``'s tensors: a CUDA graph's static buffers under capture)."""
        self.meta = meta
        tails = self.pool.tail or [None] * len(self.pool.main)
        self.views = [
            PagedKV(
                main, meta.page_table, meta.main_lens, tail, meta.tail_page_table, meta.tail_lens, meta.active,
                meta.min_active, meta.cu_seqlens, meta.max_chunk,
            )
            for main, tail in zip(self.pool.main, tails)
        ]

    def demote_layer(self, layer_id: int) -> None:
        """Quantize this step's aged tail pages into their main pages (no-op when there are none)."""
        m = self.meta
        assert m is not None
        self.demote(layer_id, m.demote_src, m.demote_dst)

    def demote(self, layer_id: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Quantize layer ``layer_id``'s tail pages ``src`` into its main pages ``dst``: the one place
        demotion runs (each layer's forward, and the CUDA-graph runner's out-of-graph overflow)."""
        if src.numel():
            moves = TailDemotion(self.pool.tail[layer_id], src, self.pool.main[layer_id], dst)
            demote_pages(moves, self.four_over_six)

    def forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h = self.qkv_rotation
        if h is None:
            return self._forward(layer_id, q, k, v)
        # H symmetric and orthogonal: its own inverse
        return self.forward_rotated(layer_id, q @ h, k @ h, v @ h) @ h

    def forward_rotated(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        assert self.qkv_rotation is not None
        return self._forward(layer_id, q, k, v)  # attention over v @ H is already in H's basis

    def _forward(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = self.meta
        assert m is not None, "bind() metadata before the forward"
        kv = self.views[layer_id]
        main, tail = kv.cache, kv.tail
        for load in self.loads:
            load.wait_layer(layer_id)
        if m.is_decode:
            self.demote_layer(layer_id)
            self._write(k, v, main, tail)
            return decode_attention(q, kv, self.sm_scale)
        out = extend_attention(q, k, v, kv, self.sm_scale)
        # NOTE: demoted and written after attending: the chunk attends to the pre-growth layout (aged
        # tail pages still in bf16) and to its fresh K/V, never to a stored copy. Demotion must precede
        # the write: a demoted page's main copy may receive some of this chunk's tokens.
        self.demote_layer(layer_id)
        self._write(k, v, main, tail)
        return out

    def _write(self, k: torch.Tensor, v: torch.Tensor, main: LayerKV, tail: LayerKV | None) -> None:
        m = self.meta
        assert m is not None
        # NOTE: with a tail, decode tokens always go to it (``host_metadata(tail_pool=True)`` checks): the
        # main write would be a launch whose every row is skipped (~1-2 us a layer at small batches).
        if not (m.is_decode and tail is not None):
            write_kv(k, v, main, m.main_slots, self.four_over_six)
        if tail is not None:
            write_kv(k, v, tail, m.tail_slots)
