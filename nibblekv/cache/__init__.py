"""The paged KV cache: pool memory, page allocators and per-request page bookkeeping."""

from nibblekv.cache.allocator import FreeListAllocator, OutOfPagesError, PageAllocator
from nibblekv.cache.manager import BaseCacheManager, Growth, TieredCacheManager, main_len_after
from nibblekv.cache.page_table import PageTable
from nibblekv.cache.pages import RequestPages
from nibblekv.cache.pool import (
    KVPool,
    PoolSpec,
    load_kv_scales,
    most_that_fit,
    page_table_bytes,
    page_table_widths,
    size_pool,
    tail_pages_for,
)

__all__ = [
    "BaseCacheManager",
    "FreeListAllocator",
    "Growth",
    "KVPool",
    "OutOfPagesError",
    "PageAllocator",
    "PageTable",
    "PoolSpec",
    "RequestPages",
    "TieredCacheManager",
    "load_kv_scales",
    "main_len_after",
    "most_that_fit",
    "page_table_bytes",
    "page_table_widths",
    "size_pool",
    "tail_pages_for",
]
