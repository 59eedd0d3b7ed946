"""Prefix cache manager: the reuse rule under the tail rule, duplicates, eviction under pressure,
locks, stats, and a random request stream with an integrity check (no leaked page) after every step."""

from __future__ import annotations

import random

import pytest
import torch

from nibblekv.cache import KVPool, PageTable, RequestPages, TieredCacheManager, main_len_after, size_pool
from nibblekv.cache.prefix import PrefixCacheManager
from nibblekv.formats import KVDtype

P = 4


def make_pool(num_pages: int = 32, window: int = 0, max_running: int = 4, sink_pages: int = 0) -> KVPool:
    spec = size_pool(
        num_layers=1, num_kv_heads=1, head_dim=16, page_size=P, kv_dtype=KVDtype.NVFP4,
        model_kv_dtype=KVDtype.FP32, recent_window=window, max_running_requests=max_running,
        budget_bytes=None, max_total_tokens=num_pages * P, sink_pages=sink_pages,
    )  # fmt: skip
    return KVPool(spec, "cpu", torch.ones(1, 2))


def run_prefill(mgr: TieredCacheManager, pages: RequestPages, n: int) -> None:
    mgr.finish_growth(mgr.grow(pages, n))


@pytest.mark.parametrize("window", [0, 8, 16])
def test_reuse_rule_keeps_the_fresh_layout(window: int) -> None:
    pool = make_pool(window=window)
    mgr = PrefixCacheManager(pool)
    donor = list(range(100, 140))  # 40 tokens, 10 pages
    d = RequestPages()
    mgr.match_prefix(d, donor)
    run_prefill(mgr, d, len(donor))
    for _ in range(window):  # decode until every prompt page is in the main pool
        run_prefill(mgr, d, d.num_tokens + 1)
    mgr.release(d, donor + [7] * window)
    for length in (3, 4, 5, 12, 13, 17, 24, 25, 40):
        tokens = donor[:length]
        pages = RequestPages()
        cached = mgr.match_prefix(pages, tokens)
        fresh_main = main_len_after(0, length, window, P)
        assert cached == min(fresh_main, length - 1) // P * P, (length, cached)
        assert mgr.max_reusable_pages(length) * P == cached
        run_prefill(mgr, pages, length)
        assert pages.num_main == fresh_main  # the same layout as a request that computed everything
        mgr.check([pages])
        mgr.release(pages)
        mgr.check([])


def test_duplicates_are_freed_and_shared_pages_kept() -> None:
    pool = make_pool()
    table = PageTable(4, 8, 1, torch.device("cpu"))
    mgr = PrefixCacheManager(pool, table)
    tokens = list(range(10))  # 2 full pages + 2 tokens
    a, b = RequestPages(), RequestPages()
    assert mgr.match_prefix(a, tokens) == 0 and mgr.match_prefix(b, tokens) == 0  # nothing cached yet
    run_prefill(mgr, a, 10)
    run_prefill(mgr, b, 10)
    table.sync([a, b])
    used = pool.main_alloc.num_used
    mgr.cache_prefix(a, tokens)
    mgr.cache_prefix(b, tokens)  # b's 2 full pages duplicate a's: freed, b now reads a's
    assert pool.main_alloc.num_used == used - 2 and b.main[:2] == a.main[:2] and b.main[2] != a.main[2]
    rows = table.sync([a, b])  # the device mirror follows the replaced entries
    for row, pages in zip(rows, (a, b)):
        assert table.main[row, : len(pages.main)].tolist() == pages.main
    mgr.check([a, b])
    assert mgr.tree.protected_pages == 2 and mgr.tree.evictable_pages == 0
    mgr.release(a, tokens + [1])
    mgr.check([b])
    mgr.release(b)
    mgr.check([])
    assert mgr.tree.evictable_pages == 2 and pool.main_alloc.num_used == 2
    c = RequestPages()
    assert mgr.match_prefix(c, tokens + [5, 5]) == 8
    assert mgr.tree.protected_pages == 2
    mgr.release(c)  # a match that was never admitted is undone
    assert mgr.tree.protected_pages == 0 and mgr.flush() == 2 and pool.all_free()


def test_eviction_under_pressure_spares_locked_pages() -> None:
    pool = make_pool(num_pages=8)
    mgr = PrefixCacheManager(pool)
    old = list(range(100, 124))  # 6 pages
    o = RequestPages()
    mgr.match_prefix(o, old)
    run_prefill(mgr, o, 24)
    mgr.release(o, old)
    keep = RequestPages()
    assert mgr.match_prefix(keep, old[:12] + [9]) == 12  # locks 3 of the 6 cached pages
    run_prefill(mgr, keep, 13)
    new = RequestPages()
    mgr.match_prefix(new, list(range(500, 520)))
    assert pool.main_alloc.num_free == 1 and mgr.tree.evictable_pages == 3
    assert mgr.can_grow(new, 16) and not mgr.can_grow(new, 17)  # 1 free + 3 evictable
    run_prefill(mgr, new, 16)
    mgr.check([keep, new])
    assert mgr.tree.match_prefix(old).num_pages == 3  # the locked half survived, the rest went
    for p in (keep, new):
        mgr.release(p)
    mgr.flush()
    assert pool.all_free()


def test_stats_count_each_admission_once() -> None:
    pool = make_pool()
    mgr = PrefixCacheManager(pool)
    tokens = list(range(17))
    a = RequestPages()
    mgr.match_prefix(a, tokens)
    run_prefill(mgr, a, 17)
    run_prefill(mgr, a, 18)  # a decode step: not an admission
    mgr.release(a, tokens + [3])
    b = RequestPages()
    assert mgr.match_prefix(b, tokens) == 16
    mgr.release(b)  # admission failed and was undone: not counted
    b = RequestPages()
    mgr.match_prefix(b, tokens)
    run_prefill(mgr, b, 17)
    assert (mgr.stats.lookup_tokens, mgr.stats.hit_tokens) == (34, 16)
    assert mgr.stats.hit_rate == pytest.approx(16 / 34)
    mgr.release(b)


@pytest.mark.parametrize("window,sinks", [(0, 0), (8, 0), (8, 1)])
def test_random_request_stream_never_leaks(window: int, sinks: int) -> None:
    """Admissions, decode steps (with demotions), finishes, preemptions and aborts in random order."""
    rng = random.Random(window)
    pool = make_pool(num_pages=40, window=window, max_running=4, sink_pages=sinks)
    mgr = PrefixCacheManager(pool)
    systems = [[rng.randrange(50) for _ in range(rng.randint(4, 20))] for _ in range(3)]
    running: list[tuple[RequestPages, list[int]]] = []
    hits = 0
    for step in range(400):
        op = rng.random()
        if op < 0.35 and len(running) < 4:
            tokens = rng.choice(systems) + [rng.randrange(50) for _ in range(rng.randint(1, 10))]
            pages = RequestPages()
            hits += mgr.match_prefix(pages, tokens) > 0
            if mgr.can_grow(pages, len(tokens), reserve_main=len(running)):
                run_prefill(mgr, pages, len(tokens))
                mgr.cache_prefix(pages, tokens)
                running.append((pages, tokens))
            else:
                mgr.release(pages)
        elif op < 0.8 and running:
            pages, tokens = rng.choice(running)
            tokens.append(rng.randrange(50))
            if mgr.can_grow(pages, len(tokens) - 1 + 1):
                run_prefill(mgr, pages, pages.num_tokens + 1)
        elif running:
            pages, tokens = running.pop(rng.randrange(len(running)))
            kind = rng.random()
            mgr.release(pages, None if kind < 0.2 else tokens[: pages.num_tokens])  # abort / finish
        mgr.check([p for p, _ in running])
    assert hits > 20 and mgr.stats.hit_rate > 0.1
    for pages, tokens in running:
        mgr.release(pages, tokens[: pages.num_tokens])
    mgr.flush()
    mgr.check([])
    assert pool.all_free()


def test_sink_page_stays_with_its_request_and_a_prefix_hit_has_none() -> None:
    """The tree holds main pages only: a request keeps (and frees) its own sink page even when its page 0
    is replaced by the tree's copy; a request whose page 0 is a prefix hit has no sink page."""
    pool = make_pool(window=8, sink_pages=1)
    table = PageTable(4, 16, 8 // P + 2, torch.device("cpu"))
    mgr = PrefixCacheManager(pool, table)
    tokens = list(range(30))
    a, b = RequestPages(), RequestPages()
    assert mgr.match_prefix(a, tokens) == 0 and mgr.match_prefix(b, tokens) == 0
    run_prefill(mgr, a, 30)
    run_prefill(mgr, b, 30)
    assert a.sink is not None and b.sink is not None
    table.sync([a, b])
    mgr.cache_prefix(a, tokens)
    mgr.cache_prefix(b, tokens)  # b's main pages duplicate a's: b now reads a's page 0 but keeps its sink
    assert b.main[0] == a.main[0] and b.sink not in (a.sink, None)
    rows = table.sync([a, b])
    for row, pages in zip(rows, (a, b)):
        main, tail = pages.attn_main(), pages.attn_tail()
        assert table.main[row, : len(main)].tolist() == main and table.tail[row, : len(tail)].tolist() == tail
    mgr.check([a, b])
    mgr.release(a, tokens)
    mgr.release(b, tokens)
    mgr.check([])
    assert pool.tail_alloc.num_used == 0  # both sinks were freed with their requests
    c = RequestPages()
    assert mgr.match_prefix(c, tokens) > 0
    run_prefill(mgr, c, 30)
    assert c.sink is None and c.attn_main() == c.main  # page 0 from the tree: read quantized
    mgr.check([c])
    mgr.release(c, tokens)
    mgr.flush()
    assert pool.all_free()
