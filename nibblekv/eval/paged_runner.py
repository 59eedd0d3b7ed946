"""Drive a model teacher-forced through the engine's own KV pool and paged attention backend.

This is the engine's path minus the scheduler and sampler: the same :class:`KVPool` (with the
``--kv-hadamard`` / ``--kv-quant-4over6`` encodings), the same tail rule and sink pages (:class:`TieredCacheManager`),
the same :class:`PagedAttentionBackend` calling the same kernels (the pure-torch reference twins on
CPU, the Triton kernels on GPU). The eval chooses which tokens
each request feeds per step, so it can force chunked prefill or one-token decode steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nibblekv.attention.paged import PagedAttentionBackend, PagedMetadata, longest_chunk
from nibblekv.cache import Growth, KVPool, PoolSpec, RequestPages, TieredCacheManager
from nibblekv.eval.configs import KVConfig
from nibblekv.formats import parse_kv_dtype
from nibblekv.model import CausalLM


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _table(rows: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    # NOTE: padded with the scratch page 0, as the engine pads, so no kernel sees an invalid page id.
    width = max([len(r) for r in rows] + [1])
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device=device)


def paged_metadata(
    backend: PagedAttentionBackend, batch: Sequence[tuple[RequestPages, Growth]], is_decode: bool
) -> PagedMetadata:
    """The backend's metadata for one step, from the engine's own per-token slot and length rules
    (``backend.plan``), with page tables built from the requests' pages (no engine page table here)."""
    h = backend.plan(batch, is_decode)
    device = backend.pool.device

    def t(key: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(h[key], dtype=dtype, device=device)

    return PagedMetadata(
        is_decode=is_decode,
        page_table=_table([p.attn_main() for p, _ in batch], device),
        main_lens=t("main_lens", torch.int32),
        tail_page_table=(
            _table([p.attn_tail() for p, _ in batch], device)
            if is_decode
            else t("prefix_tail", torch.int32).view(len(batch), -1)
        ),
        tail_lens=t("tail_lens", torch.int32),
        main_slots=t("main_slots", torch.int64),
        tail_slots=t("tail_slots", torch.int64),
        cu_seqlens=None if is_decode else t("cu_seqlens", torch.int32),
        demote_src=t("demote_src", torch.int64),
        demote_dst=t("demote_dst", torch.int64),
        max_chunk=None if is_decode else longest_chunk(h["cu_seqlens"]),
    )


class PagedRunner:
    """Teacher-forced requests over a KV pool of one configuration.

    ``max_requests`` requests of up to ``max_len`` tokens each fit at once. The tail pool is sized for
    every request prefilling a chunk at the same time (old and new window both held during the
    forward), which the engine's own sizing (one chunked prefill at a time) does not need. With
    ``config.prefill_window``, non-final chunks (``step(..., prefilling=True)``) keep the engine's
    default prefill window, ``prefill_chunk + W`` tokens (``--kv-prefill-window``).
    """

    def __init__(
        self,
        model: CausalLM,
        config: KVConfig,
        *,
        max_requests: int,
        max_len: int,
        global_scales: torch.Tensor | None = None,
        page_size: int = 16,
        prefill_chunk: int = 0,
    ) -> None:
        if config.sinks:
            raise ValueError(
                f"{config.name}: bf16 sink tokens (_s<N>) are a fake-quant study option; the engine's "
                "cache keeps a whole sink page (_sink)"
            )
        if config.smoothed:
            raise ValueError(
                f"{config.name}: K/V mean smoothing (_smk/_smv) is a fake-quant study option; the engine's "
                "cache does not smooth"
            )
        if config.window % page_size:
            raise ValueError(f"{config.name}: the tail window must be a multiple of page_size ({page_size})")
        mc = model.config
        self.model = model
        self.config = config
        self.page_size = page_size
        kv_dtype = parse_kv_dtype(config.kv_dtype, model.dtype)
        window = config.window if kv_dtype.quantized else 0
        sinks = config.sink_pages if window else 0
        prefill = window + prefill_chunk if window and config.prefill_window else window
        tail_pages = max_requests * (2 * _cdiv(prefill, page_size) + 1 + sinks) if window else 0
        spec = PoolSpec(
            num_layers=mc.num_kv_layers,
            num_kv_heads=mc.num_kv_heads,
            head_dim=mc.head_dim,
            page_size=page_size,
            kv_dtype=kv_dtype,
            tail_dtype=parse_kv_dtype("auto", model.dtype),
            num_pages=max_requests * (_cdiv(max_len, page_size) + 1),
            num_tail_pages=tail_pages,
            recent_window=window,
            hadamard=config.hadamard,
            four_over_six=config.four_over_six,
            sink_pages=sinks,
            prefill_window=prefill,
        )
        scales = torch.ones(mc.num_kv_layers, 2)
        if config.calibrated:
            if global_scales is None:
                raise ValueError(f"{config.name}: calibrated scales requested but none given")
            scales = global_scales
        self.pool = KVPool(spec, model.device, scales)
        self.manager = TieredCacheManager(self.pool)
        self.paged = PagedAttentionBackend(self.pool)  # --kv-hadamard / --kv-quant-4over6 ride on the spec
        self.requests: list[RequestPages] = []

    def start(self, num_requests: int) -> None:
        """Release any previous requests and start ``num_requests`` empty ones."""
        self.release()
        self.requests = [RequestPages() for _ in range(num_requests)]

    def release(self) -> None:
        for pages in self.requests:
            self.manager.release(pages)
        self.requests = []

    @torch.inference_mode()
    def step(self, chunks: Sequence[Sequence[int]], prefilling: bool = False) -> torch.Tensor:
        """Feed ``chunks[i]`` (token ids, >= 1) to request ``i``; final hidden states ``[sum len, hidden]``.

        A step where every request feeds one token after earlier ones runs the decode path (write,
        then attend over the cache); any other step is an extend (prefill chunk) step. ``prefilling``:
        the prompts go on after these chunks (the prefill window applies, as in the engine).
        """
        if len(chunks) != len(self.requests) or any(len(c) == 0 for c in chunks):
            raise ValueError("one non-empty chunk per started request")
        is_decode = all(len(c) == 1 and p.num_tokens > 0 for c, p in zip(chunks, self.requests))
        ids: list[int] = []
        positions: list[int] = []
        for c, pages in zip(chunks, self.requests):
            ids.extend(int(t) for t in c)
            positions.extend(range(pages.num_tokens, pages.num_tokens + len(c)))
        growths = [
            self.manager.grow(p, p.num_tokens + len(c), prefilling) for c, p in zip(chunks, self.requests)
        ]
        device = self.model.device
        pairs = list(zip(self.requests, growths))
        meta = paged_metadata(self.paged, pairs, is_decode)
        self.paged.bind(meta)
        try:
            hidden = self.model.forward(
                torch.tensor(ids, dtype=torch.int64, device=device),
                torch.tensor(positions, dtype=torch.int64, device=device),
                self.paged,
            )
        finally:
            for g in growths:
                self.manager.finish_growth(g)
        return hidden
