"""Resident requests as the engine sizes its pool: everything it allocates per request, not just KV tokens.

The engine carves its KV budget into (nibblekv/engine/setup.py, nibblekv/cache/pool.py):

* the page table: int32 page ids, one row per running request plus a padding row, each row
  ``ceil(context / page) + 1`` main ids and the tail ids below;
* the tail pool (quantized dtypes with ``--kv-recent-window`` W > 0), in the model's dtype: per running
  request ``W / page + 1`` pages plus the bf16 sink page(s) (default 1 for nvfp4), plus
  ``2 x (ceil(max(Wp, W) / page) + 1)`` pages for the chunked prefill in flight (Wp: the prefill window,
  default ``min(chunk, 2048) + W``), plus a scratch page;
* hybrid models: the linear-attention state pool, one slot per running request, the prefix cache's state
  snapshots (as many again by default, ``--max-mamba-cache-size``; none with ``--disable-radix-cache``)
  and a scratch slot;
* the main pool: what is left, in whole pages, minus its scratch page.

A request is resident when its tokens (whole pages) fit in the main pool next to the others'. This module
feeds the engine's own arithmetic (``nibblekv.cache.pool``: ``size_pool``, ``page_table_bytes``; no
allocation, no model) with a model shape, so ``nibblekv plan`` prints the count the engine's sizing
(:func:`nibblekv.engine.setup.resident_capacity`) reaches; a test holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from nibblekv.cache.pool import PoolSpec, most_that_fit, page_table_bytes, size_pool
from nibblekv.cache.state_pool import snapshot_slots
from nibblekv.formats import KVDtype
from nibblekv.planner.shape import ModelShape, PlanError

MAX_DEFAULT_PREFILL_CHUNK: int = 2048  # the engine's default prefill window covers this much of a chunk


@dataclass(frozen=True)
class EngineOptions:
    """The engine flags that change what a request costs (defaults: the engine's)."""

    page_size: int = 16
    kv_recent_window: int = 64
    chunked_prefill_size: int = 2048  # <= 0: unchunked
    kv_sink_pages: int | None = None  # None: 1 for nvfp4, 0 otherwise
    kv_prefill_window: int | None = None  # None: min(chunk, 2048) + W
    model_dtype: KVDtype = KVDtype.BF16  # the tail pool's dtype
    disable_radix_cache: bool = False  # hybrid models: no state snapshots
    max_mamba_cache_size: int | None = None  # hybrid models: state slots (None: 2x the running requests)

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise PlanError(f"--page-size must be >= 1, got {self.page_size}")
        if self.kv_recent_window < 0 or self.kv_recent_window % self.page_size:
            raise PlanError(
                f"--kv-recent-window must be a multiple of --page-size, got {self.kv_recent_window}"
            )

    def window(self, dtype: KVDtype) -> int:
        """W in tokens: 0 for unquantized dtypes (nothing to keep exact)."""
        return self.kv_recent_window if dtype.quantized else 0

    def sink_pages(self, dtype: KVDtype) -> int:
        if not self.window(dtype):
            return 0
        return int(dtype is KVDtype.NVFP4) if self.kv_sink_pages is None else self.kv_sink_pages

    def prefill_window(self, dtype: KVDtype) -> int:
        w = self.window(dtype)
        if not w:
            return 0
        if self.kv_prefill_window is not None:
            return max(self.kv_prefill_window, w)
        if self.chunked_prefill_size <= 0:
            return w
        return min(self.chunked_prefill_size, MAX_DEFAULT_PREFILL_CHUNK) + w

    def request_tokens(self, context: int) -> int:
        """Main-pool tokens one request of ``context`` tokens is sized for: its pages plus one."""
        return (-(-context // self.page_size) + 1) * self.page_size


def _pool(
    shape: ModelShape, dtype: KVDtype, opts: EngineOptions, running: int, budget: int | None
) -> PoolSpec:
    """``size_pool`` as the engine calls it; without a budget, only the widths (one page)."""
    return size_pool(
        num_layers=shape.num_kv_layers, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
        page_size=opts.page_size, kv_dtype=dtype, model_kv_dtype=opts.model_dtype,
        recent_window=opts.kv_recent_window, max_running_requests=running, budget_bytes=budget,
        max_total_tokens=opts.page_size if budget is None else None,
        sink_pages=opts.sink_pages(dtype), prefill_window=opts.prefill_window(dtype),
    )  # fmt: skip


def main_pool_tokens(
    shape: ModelShape,
    dtype: KVDtype,
    budget_bytes: int | Fraction,
    running: int,
    context_len: int,
    opts: EngineOptions,
) -> int:
    """Main-pool tokens the engine allocates from ``budget_bytes`` for ``running`` requests (0: none)."""
    # the engine takes the states first: a slot per request, the snapshots, the CUDA graphs' scratch slot
    left = int(budget_bytes)
    if shape.state_bytes_per_request:
        try:
            snaps = snapshot_slots(running, opts.max_mamba_cache_size, not opts.disable_radix_cache)
        except ValueError:  # more running requests than state slots
            return 0
        left -= (running + snaps + 1) * shape.state_bytes_per_request
    left -= page_table_bytes(_pool(shape, dtype, opts, running, None), running, context_len)
    try:
        return _pool(shape, dtype, opts, running, left).max_total_num_tokens
    except ValueError:  # not one main page left
        return 0


def resident_requests(
    shape: ModelShape,
    dtype: KVDtype,
    budget_bytes: int | Fraction,
    tokens_per_request: int,
    context_len: int,
    opts: EngineOptions | None = None,
) -> int:
    """The most requests of ``tokens_per_request`` main-pool tokens that fit together, each request's tail,
    sink and table row paid for (``context_len``: the page table's row length, the engine's context)."""
    opts = opts or EngineOptions()

    def holds(n: int) -> bool:
        tokens = main_pool_tokens(shape, dtype, budget_bytes, n, context_len, opts)
        return tokens >= opts.page_size and tokens >= n * tokens_per_request

    return most_that_fit(holds)
