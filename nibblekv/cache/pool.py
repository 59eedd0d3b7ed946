"""The KV pool: every layer's pages, in the quantized main pool and the unquantized tail pool.

Sizing follows SGLang: on CUDA the weights plus the KV pool take ``--mem-fraction-static`` of GPU
memory; elsewhere ``--max-total-tokens`` (or ``--mem-budget-gib``) sets it. The tail pool (pages for
each running request's newest ``--kv-recent-window`` tokens, in the model's dtype) is carved out of
the same budget first; ``max_total_num_tokens`` counts main-pool tokens only. With sink pages
(``--kv-sink-pages``) the tail pool also holds one bf16 copy of each running request's first page.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from nibblekv.cache.allocator import FreeListAllocator, PageAllocator
from nibblekv.formats import KVDtype, PageLayout
from nibblekv.formats.layer_kv import LayerKV

GIB: float = float(1 << 30)
# NOTE: page 0 of each pool is a scratch page (padded batch entries write there), never allocated.
SCRATCH_PAGES: int = 1
PAGE_ID_BYTES: int = 4  # page-table entries are int32 (page ids; kernels widen them before scaling)


def most_that_fit(holds: Callable[[int], bool]) -> int:
    """The largest ``n >= 0`` with ``holds(n)`` (0 when ``holds(1)`` is false), for a ``holds`` that is true up to
    some ``n`` and false above it: doubling, then bisection. Sizes resident-request counts (the engine's
    ``resident_capacity``, the planner) whose per-request tail and page-table bytes shrink the main pool."""
    lo, hi = 0, 1
    while holds(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class PoolSpec:
    """The shape of a KV pool, decided before any memory is allocated."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    kv_dtype: KVDtype
    tail_dtype: KVDtype  # the model's dtype
    num_pages: int  # main pool, scratch page excluded
    num_tail_pages: int  # 0 when the recent window is off
    recent_window: int
    # How K/V are encoded (see nibblekv.attention.paged): rotated by the Hadamard matrix along
    # head_dim before storing, and NVFP4 block scales chosen by 4over6. Neither changes the layout.
    hadamard: bool = False
    four_over_six: bool = False
    # bf16 copies of each request's first page kept in the tail pool (nibblekv.cache.manager); 0 or 1.
    # NOTE: size_pool() makes it 0 without a tail pool, and num_tail_pages counts them.
    sink_pages: int = 0
    # The tail a prompt keeps while it is prefilled in chunks (nibblekv.cache.manager); 0 = the
    # recent window. NOTE: size_pool() makes it 0 without a tail pool, and num_tail_pages counts it.
    prefill_window: int = 0

    @property
    def layout(self) -> PageLayout:
        return PageLayout(self.kv_dtype, self.num_kv_heads, self.head_dim, self.page_size)

    @property
    def tail_layout(self) -> PageLayout:
        return PageLayout(self.tail_dtype, self.num_kv_heads, self.head_dim, self.page_size)

    @property
    def max_total_num_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def tail_tokens(self) -> int:
        return self.num_tail_pages * self.page_size

    def main_bytes(self) -> int:
        """K + V bytes of the main pool, all layers."""
        return self.num_pages * self.page_size * self.layout.bytes_per_token() * self.num_layers

    def tail_bytes(self) -> int:
        return self.tail_tokens * self.tail_layout.bytes_per_token() * self.num_layers


def page_table_widths(spec: PoolSpec, context_len: int) -> tuple[int, int]:
    """(main, tail) page ids per page-table row: ``context_len`` tokens of main pages (+1: the partial
    page), and the tail row: the window (the prefill window while a prompt is chunked), the page being
    demoted and the sink page(s)."""
    p = spec.page_size
    tail = -(-max(spec.recent_window, spec.prefill_window) // p) + 1 + spec.sink_pages
    return -(-context_len // p) + 1, max(1, tail)


def page_table_bytes(spec: PoolSpec, max_running: int, context_len: int) -> int:
    """Device bytes of the page table (int32 ids, one row per running request plus the padding row):
    at 1M tokens a row is 65K pages, 256 KiB, so 128 rows take 32 MiB of the KV budget."""
    main, tail = page_table_widths(spec, context_len)
    return (max_running + 1) * (main + tail) * PAGE_ID_BYTES


def tail_pages_for(
    max_running_requests: int, recent_window: int, page_size: int, sink_pages: int = 0, prefill_window: int = 0
) -> int:
    """Tail pages so every running request can hold its window (and its sink pages).

    Each request gets ``W/P + 1`` pages (+1: during a decode step the page being demoted is still
    held while the next one is written) plus ``sink_pages``. The one chunked prefill in flight holds
    up to ``Wp' = ceil(max(Wp, W) / P) + 1`` pages between steps, and during a step its old window
    stays allocated while the next chunk is written; a step that ends one chunked prompt may start
    the next: ``2 * Wp'`` pages on top cover both.
    """
    if recent_window == 0:
        return 0
    per_window = recent_window // page_size
    per_prefill = -(-max(prefill_window, recent_window) // page_size) + 1
    return max_running_requests * (per_window + 1 + sink_pages) + 2 * per_prefill


def size_pool(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    kv_dtype: KVDtype,
    model_kv_dtype: KVDtype,
    recent_window: int,
    max_running_requests: int,
    budget_bytes: int | None,
    max_total_tokens: int | None,
    sink_pages: int = 0,
    prefill_window: int = 0,
) -> PoolSpec:
    """Decide the pool's page counts from a byte budget and/or a token cap (the smaller wins).

    ``recent_window`` is forced to 0 for unquantized KV dtypes (there is nothing to keep exact), and
    ``sink_pages`` / ``prefill_window`` to 0 without a tail pool (they live there). Raises
    ``ValueError`` when the budget does not leave room for one main page.
    """
    if sink_pages not in (0, 1):
        raise ValueError(f"sink_pages must be 0 or 1, got {sink_pages}")
    if prefill_window < 0:
        raise ValueError(f"prefill_window must be >= 0, got {prefill_window}")
    window = recent_window if kv_dtype.quantized else 0
    sinks = sink_pages if window else 0
    prefill = max(prefill_window, window) if window else 0
    num_tail = tail_pages_for(max_running_requests, window, page_size, sinks, prefill)
    spec = PoolSpec(
        num_layers, num_kv_heads, head_dim, page_size, kv_dtype, model_kv_dtype, 0, num_tail, window,
        sink_pages=sinks, prefill_window=prefill,
    )  # fmt: skip
    limits: list[int] = []
    if max_total_tokens is not None:
        limits.append(math.ceil(max_total_tokens / page_size))
    if budget_bytes is not None:
        page_bytes = page_size * spec.layout.bytes_per_token() * num_layers
        tail_page_bytes = page_size * spec.tail_layout.bytes_per_token() * num_layers
        left = budget_bytes - (num_tail + SCRATCH_PAGES) * tail_page_bytes
        limits.append(left // page_bytes - SCRATCH_PAGES)
    if not limits:
        raise ValueError("size_pool needs a byte budget or max_total_tokens")
    num_pages = int(min(limits))
    if num_pages < 1:
        raise ValueError(
            f"not enough memory for the KV cache: budget {budget_bytes / GIB if budget_bytes else 0:.3f} GiB, "
            f"tail pool {spec.tail_bytes() / GIB:.3f} GiB; raise --mem-fraction-static or lower "
            "--max-running-requests / --kv-recent-window"
        )
    return replace(spec, num_pages=num_pages)


def load_kv_scales(
    path: str | Path | None, num_layers: int, device: torch.device | str, hadamard: bool | None = None
) -> torch.Tensor:
    """Per-layer global scales, FP32 ``[num_layers, 2]`` (K, V); all 1.0 without a file.

    Accepted JSON: ``{"k_scale": [floats per layer], "v_scale": [...]}`` or
    ``{"layers": [{"k": float, "v": float}, ...]}``. Scales must be finite and > 0. Given ``hadamard``
    (whether the cache stores rotated K/V), a ``nibblekv calibrate`` file made for the other rotation is
    refused (its ``"hadamard"`` field; amax differs after the rotation).
    """
    scales = torch.ones(num_layers, 2, dtype=torch.float32)
    if path is not None:
        raw = json.loads(Path(path).read_text())
        if hadamard is not None and "hadamard" in raw and bool(raw["hadamard"]) != hadamard:
            made, use = ("with", "without") if raw["hadamard"] else ("without", "with")
            raise ValueError(
                f"--kv-scales-path {path}: scales were calibrated {made} the Hadamard rotation but the "
                f"cache runs {use} it; recalibrate (`nibblekv calibrate "
                f"{'--hadamard' if hadamard else '--no-hadamard'}`) or pass "
                f"{'--kv-hadamard' if raw['hadamard'] else '--no-kv-hadamard'}"
            )
        if "layers" in raw:
            k = [float(x["k"]) for x in raw["layers"]]
            v = [float(x["v"]) for x in raw["layers"]]
        else:
            k, v = [float(x) for x in raw["k_scale"]], [float(x) for x in raw["v_scale"]]
        if len(k) != num_layers or len(v) != num_layers:
            raise ValueError(f"{path}: expected {num_layers} K and V scales, got {len(k)} and {len(v)}")
        scales = torch.tensor([k, v], dtype=torch.float32).T.contiguous()
        if not bool(torch.isfinite(scales).all()) or bool((scales <= 0).any()):
            raise ValueError(f"{path}: KV scales must be finite and > 0")
    return scales.to(device)


class KVPool:
    """All layers' K/V pages plus the two allocators that own the page ids.

    ``main[i]`` / ``tail[i]`` are layer ``i``'s :class:`LayerKV`; one page id names the same page in
    every layer. ``tail`` is empty when the recent window is off.
    """

    def __init__(self, spec: PoolSpec, device: torch.device | str, global_scales: torch.Tensor) -> None:
        if tuple(global_scales.shape) != (spec.num_layers, 2):
            raise ValueError(f"global scales must be [{spec.num_layers}, 2], got {list(global_scales.shape)}")
        self.spec = spec
        self.device = torch.device(device)
        # NOTE: each layer's global_scale is a view of this tensor's row, so a recalibration
        # written here is seen by every kernel.
        self.global_scales = global_scales.to(device=self.device, dtype=torch.float32)
        n_main = spec.num_pages + SCRATCH_PAGES
        self.main: list[LayerKV] = [
            LayerKV.allocate(spec.layout, n_main, self.device, self.global_scales[i])
            for i in range(spec.num_layers)
        ]
        self.tail: list[LayerKV] = []
        if spec.num_tail_pages:
            n_tail = spec.num_tail_pages + SCRATCH_PAGES
            ones = torch.ones(2, dtype=torch.float32, device=self.device)
            self.tail = [
                LayerKV.allocate(spec.tail_layout, n_tail, self.device, ones) for _ in range(spec.num_layers)
            ]
        self.main_alloc: PageAllocator = FreeListAllocator(spec.num_pages)
        self.tail_alloc: PageAllocator = FreeListAllocator(spec.num_tail_pages)
        # Main pages held only by the prefix cache (freed on demand); its manager installs the count.
        self.cached_pages: Callable[[], int] = lambda: 0

    @property
    def page_size(self) -> int:
        return self.spec.page_size

    @property
    def recent_window(self) -> int:
        return self.spec.recent_window

    def all_free(self) -> bool:
        """No request holds a page (pages only the prefix cache keeps count as free)."""
        return self.main_alloc.num_used == self.cached_pages() and self.tail_alloc.num_used == 0

    def used_tokens(self) -> int:
        """Token slots held by requests, both pools (whole pages; the prefix cache's spare pages excluded)."""
        return (self.main_alloc.num_used - self.cached_pages() + self.tail_alloc.num_used) * self.page_size

    def capacity_tokens(self) -> int:
        return (self.main_alloc.num_pages + self.tail_alloc.num_pages) * self.page_size

    def token_usage(self) -> float:
        return self.used_tokens() / max(1, self.capacity_tokens())

    def startup_lines(self, max_running_requests: int, context_len: int) -> list[str]:
        """SGLang's start-up lines, with the tail pool appended to the first."""
        s = self.spec
        half = s.main_bytes() / 2 / GIB
        line = f"KV cache is allocated. dtype: {s.kv_dtype.value}, #tokens: {s.max_total_num_tokens}, "
        line += f"K size: {half:.2f} GiB, V size: {half:.2f} GiB"
        if s.num_tail_pages:
            sinks = f", sink pages: {s.sink_pages}" if s.sink_pages else ""
            if s.prefill_window > s.recent_window:
                sinks += f", prefill W={s.prefill_window}"
            line += (
                f", tail pages: {s.num_tail_pages} ({s.tail_dtype.value}, W={s.recent_window}{sinks}, "
                f"{s.tail_bytes() / GIB:.2f} GiB)"
            )
        if s.hadamard or s.four_over_six:
            line += f", hadamard: {s.hadamard}, 4over6: {s.four_over_six}"
        return [
            line,
            (
                f"max_total_num_tokens={s.max_total_num_tokens}, max_running_requests={max_running_requests}, "
                f"context_len={context_len}, page_size={s.page_size}"
            ),
        ]
