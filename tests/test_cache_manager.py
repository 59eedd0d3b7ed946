"""Page allocator contract, the tail rule's invariants, pool sizing and KV scale files."""

from __future__ import annotations

import json
import random

import pytest
import torch

from nibblekv.cache import (
    FreeListAllocator,
    KVPool,
    OutOfPagesError,
    RequestPages,
    TieredCacheManager,
    load_kv_scales,
    main_len_after,
    size_pool,
)
from nibblekv.formats import KVDtype


def _pool(num_pages: int = 64, window: int = 32, page: int = 4, max_running: int = 4) -> KVPool:
    spec = size_pool(
        num_layers=2,
        num_kv_heads=1,
        head_dim=16,
        page_size=page,
        kv_dtype=KVDtype.NVFP4,
        model_kv_dtype=KVDtype.FP32,
        recent_window=window,
        max_running_requests=max_running,
        budget_bytes=None,
        max_total_tokens=num_pages * page,
    )
    return KVPool(spec, "cpu", torch.ones(2, 2))


def test_allocator_contract() -> None:
    a = FreeListAllocator(4)
    pages = a.alloc(3)
    assert sorted(pages) == [1, 2, 3] and a.num_free == 1  # page 0 is the scratch page
    with pytest.raises(OutOfPagesError):
        a.alloc(2)
    assert a.num_free == 1  # a failed alloc changes nothing
    a.free(pages[:1])
    with pytest.raises(ValueError):
        a.free(pages[:1])  # double free
    a.free(pages[1:])
    assert a.num_free == 4 and a.num_used == 0


def test_main_len_after_matches_rule() -> None:
    assert main_len_after(0, 10, 0, 4) == 12  # W = 0: everything in the main pool
    assert main_len_after(0, 30, 32, 4) == 0  # fits in the window
    assert main_len_after(0, 33, 32, 4) == 4
    assert main_len_after(8, 33, 32, 4) == 8  # never decreases


def _check_invariants(pages: RequestPages, page: int, window: int) -> None:
    assert len(pages.main) * page == pages.num_main
    assert len(pages.tail) == -(-max(pages.num_tokens - pages.num_main, 0) // page)
    assert pages.num_tokens - pages.num_main <= window
    assert pages.num_main % page == 0


@pytest.mark.parametrize("window", [0, 8, 32])
def test_tail_rule_random_growth(window: int) -> None:
    """Random chunk sizes: invariants hold, every slot is unique, demotion maps tail -> the right main page."""
    page = 4
    pool = _pool(num_pages=200, window=window, page=page)
    mgr = TieredCacheManager(pool)
    rng = random.Random(window)
    reqs = [RequestPages() for _ in range(3)]
    owner: dict[tuple[bool, int], tuple[int, int]] = {}  # (pool, slot) -> (request, position)
    for _ in range(60):
        r = rng.randrange(3)
        pages = reqs[r]
        new_len = pages.num_tokens + rng.choice([1, 1, 1, 3, 9, 20])
        before_tail = list(pages.tail)
        g = mgr.grow(pages, new_len)
        _check_invariants(pages, page, window)
        # demoted pages are the oldest tail pages and land at main indices [old Lq / P, ...)
        assert list(g.demote_src) == before_tail[: len(g.demote_src)]
        for src, dst in zip(g.demote_src, g.demote_dst):
            for key in [k for k, v in owner.items() if not k[0] and k[1] // page == src]:
                req, pos = owner.pop(key)
                assert pages.slot(pos, page) == (True, dst * page + pos % page)
                owner[(True, dst * page + pos % page)] = (req, pos)
        for pos in range(g.old_len, g.new_len):
            key = pages.slot(pos, page)
            assert key not in owner
            owner[key] = (r, pos)
        mgr.finish_growth(g)
    for pages in reqs:
        mgr.release(pages)
    assert pool.all_free()


def test_grow_needs_and_release() -> None:
    pool = _pool(num_pages=3, window=8, page=4, max_running=1)
    mgr = TieredCacheManager(pool)
    pages = RequestPages()
    assert mgr.pages_needed(pages, 9) == (1, 2)  # [0, 4) main, [4, 9) tail
    assert mgr.can_grow(pages, 9) and not mgr.can_grow(pages, 9, reserve_main=3)
    assert not mgr.can_grow(pages, 100)
    g = mgr.grow(pages, 9)
    assert (g.prefix_main, g.prefix_tail) == (0, 0)
    mgr.finish_growth(g)
    g = mgr.grow(pages, 10)  # Lq 4 -> 4: nothing demoted
    assert g.demote_src == () and (g.prefix_main, g.prefix_tail) == (4, 5)
    mgr.finish_growth(g)
    mgr.release(pages)
    assert pool.all_free() and pages.num_tokens == 0


def test_pool_sizing_nvfp4_vs_fp8_and_tail() -> None:
    common: dict = {
        "num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "page_size": 16, "model_kv_dtype": KVDtype.BF16,
    }  # fmt: skip
    budget = 100 << 30
    fp8 = size_pool(kv_dtype=KVDtype.FP8, recent_window=64, max_running_requests=128,
                    budget_bytes=budget, max_total_tokens=None, **common)  # fmt: skip
    nv = size_pool(kv_dtype=KVDtype.NVFP4, recent_window=64, max_running_requests=128,
                   budget_bytes=budget, max_total_tokens=None, **common)  # fmt: skip
    bf16 = size_pool(kv_dtype=KVDtype.BF16, recent_window=64, max_running_requests=128,
                     budget_bytes=budget, max_total_tokens=None, **common)  # fmt: skip
    assert bf16.recent_window == 0 and bf16.num_tail_pages == 0  # no tail for unquantized KV
    assert fp8.num_tail_pages == 128 * 5 + 4
    assert nv.num_tail_pages == 128 * 5 + 4
    assert nv.main_bytes() + nv.tail_bytes() <= budget
    assert nv.max_total_num_tokens >= 1.75 * fp8.max_total_num_tokens
    capped = size_pool(kv_dtype=KVDtype.NVFP4, recent_window=64, max_running_requests=128,
                       budget_bytes=budget, max_total_tokens=1000, **common)  # fmt: skip
    assert capped.max_total_num_tokens == 1008  # whole pages
    with pytest.raises(ValueError, match="not enough memory"):
        size_pool(kv_dtype=KVDtype.NVFP4, recent_window=64, max_running_requests=128,
                  budget_bytes=1 << 20, max_total_tokens=None, **common)  # fmt: skip


def test_pool_layers_and_startup_lines() -> None:
    pool = _pool(num_pages=8, window=8, page=4, max_running=2)
    assert len(pool.main) == 2 and len(pool.tail) == 2
    assert pool.main[0].num_pages == 9 and pool.tail[0].num_pages == pool.spec.num_tail_pages + 1
    pool.global_scales[1, 0] = 2.0
    assert float(pool.main[1].global_scale[0]) == 2.0  # each layer's scale is a view
    lines = pool.startup_lines(2, 128)
    assert lines[0].startswith("KV cache is allocated. dtype: nvfp4, #tokens: 32, K size: ")
    assert "tail pages: 8 (fp32, W=8" in lines[0]
    assert lines[1] == "max_total_num_tokens=32, max_running_requests=2, context_len=128, page_size=4"


def test_kv_scales_file(tmp_path) -> None:
    assert torch.equal(load_kv_scales(None, 3, "cpu"), torch.ones(3, 2))
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"k_scale": [1, 2, 3], "v_scale": [4, 5, 6]}))
    assert load_kv_scales(p, 3, "cpu").tolist() == [[1, 4], [2, 5], [3, 6]]
    p.write_text(json.dumps({"layers": [{"k": 0.5, "v": 0.25}]}))
    assert load_kv_scales(p, 1, "cpu").tolist() == [[0.5, 0.25]]
    with pytest.raises(ValueError, match="expected 2"):
        load_kv_scales(p, 2, "cpu")
    p.write_text(json.dumps({"k_scale": [0.0], "v_scale": [1.0]}))
    with pytest.raises(ValueError, match="finite and > 0"):
        load_kv_scales(p, 1, "cpu")


def test_page_table_mirrors_page_lists() -> None:
    """After every sync, each request's device row equals its page lists; released rows are reused."""
    from nibblekv.cache import PageTable

    pool = _pool(num_pages=200, window=8, page=4, max_running=3)
    table = PageTable(3, main_width=64, tail_width=3, device=torch.device("cpu"))
    mgr = TieredCacheManager(pool, table)
    rng = random.Random(1)
    reqs = [RequestPages() for _ in range(3)]
    for step in range(80):
        r = rng.randrange(3)
        if step % 25 == 24:
            mgr.release(reqs[r])  # preemption / finish: the row goes back
            continue
        g = mgr.grow(reqs[r], reqs[r].num_tokens + rng.choice([1, 2, 7]))
        rows = table.sync(reqs)
        mgr.finish_growth(g)
        assert len(set(rows)) == 3 and 0 not in rows
        for p, row in zip(reqs, rows):
            assert table.main[row, : len(p.main)].tolist() == p.main
            assert table.tail[row, : len(p.tail)].tolist() == p.tail
    for p in reqs:
        mgr.release(p)
    assert pool.all_free() and sorted(table._free) == [1, 2, 3]


def test_extend_reads_the_layout_before_its_growth() -> None:
    """Growth records the pre-growth tail: an extend attends over it (bf16), demotion comes after."""
    pool = _pool(num_pages=8, window=8, page=4, max_running=1)
    mgr = TieredCacheManager(pool)
    pages = RequestPages()
    mgr.finish_growth(mgr.grow(pages, 9))  # main [0, 4), tail [4, 9) in 2 pages
    old_tail = tuple(pages.tail)
    g = mgr.grow(pages, 20)  # Lq 4 -> 12: both old tail pages demoted
    assert g.demote_src == old_tail == g.old_tail and (g.prefix_main, g.prefix_tail) == (4, 5)
    assert pages.num_main == 12 and len(pages.tail) == 2  # [12, 20)
    mgr.finish_growth(g)
    g = mgr.grow(pages, 21)  # Lq 12 -> 16: one page demoted, the other still in the tail
    assert g.old_tail[0] == g.demote_src[0] and g.old_tail[1] == pages.tail[0]
    assert (g.prefix_main, g.prefix_tail) == (12, 8)
    mgr.finish_growth(g)
    mgr.release(pages)
    assert pool.all_free()
    # W = 0: Lq is page-rounded past the tokens, the prefix is still read from main only
    pool0 = _pool(num_pages=8, window=0, page=4, max_running=1)
    mgr0 = TieredCacheManager(pool0)
    p0 = RequestPages()
    mgr0.finish_growth(mgr0.grow(p0, 5))
    g0 = mgr0.grow(p0, 9)
    assert g0.old_main == 8 and (g0.prefix_main, g0.prefix_tail) == (5, 0) and g0.old_tail == ()
