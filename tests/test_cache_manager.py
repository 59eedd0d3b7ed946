"""Page allocator contract, the tail rule's invariants, pool sizing and KV scale files."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from nibblekv.cache import (
    FreeListAllocator,
    Growth,
    KVPool,
    OutOfPagesError,
    RequestPages,
    TieredCacheManager,
    load_kv_scales,
    main_len_after,
    size_pool,
)
from nibblekv.formats import KVDtype


def _pool(
    num_pages: int = 64,
    window: int = 32,
    page: int = 4,
    max_running: int = 4,
    sink_pages: int = 0,
    prefill_window: int = 0,
) -> KVPool:
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
        sink_pages=sink_pages,
        prefill_window=prefill_window,
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


@pytest.mark.parametrize("window,sinks", [(0, 0), (8, 0), (32, 0), (0, 1), (8, 1), (32, 1)])
def test_tail_rule_random_growth(window: int, sinks: int) -> None:
    """Random chunk sizes: invariants hold, every slot is unique, demotion maps tail -> the right main page;
    with sink pages, each request with main pages holds exactly one sink and free counts add up."""
    page = 4
    pool = _pool(num_pages=200, window=window, page=page, sink_pages=sinks)
    assert pool.spec.sink_pages == (sinks if window else 0)  # NOTE: no tail pool, no sink page
    mgr = TieredCacheManager(pool)
    rng = random.Random(window + sinks)
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
        _check_sinks(pool, reqs, page)
    for pages in reqs:
        mgr.release(pages)
    assert pool.all_free()


def _check_sinks(pool: KVPool, reqs: list[RequestPages], page: int) -> None:
    """Sink bookkeeping between steps: one sink per request with main pages, no tail page leaked."""
    held = [t for p in reqs for t in p.attn_tail()]
    assert len(set(held)) == len(held) == pool.tail_alloc.num_used
    for p in reqs:
        assert (p.sink is not None) == bool(pool.spec.sink_pages and p.main)
        if p.sink is not None:
            assert p.attn_main() == p.main[1:] and p.attn_tail() == [p.sink, *p.tail]


def test_sink_page_made_by_demotion_or_written_beside_page_0() -> None:
    """Page 0's sink: the demoted tail page is kept (a partly filled one gets the chunk's tokens too),
    or a fresh tail page when a first chunk longer than W + P writes page 0 straight to the main pool."""
    from nibblekv.attention.paged import host_metadata

    pool = _pool(num_pages=16, window=8, page=4, max_running=2, sink_pages=1)
    mgr = TieredCacheManager(pool)
    a, b = RequestPages(), RequestPages()
    mgr.finish_growth(mgr.grow(a, 2))  # [0, 2) in tail page t0
    t0 = a.tail[0]
    assert mgr.pages_needed(a, 12) == (1, 2)  # demotion keeps t0: no extra tail page
    g = mgr.grow(a, 12)  # Lq 0 -> 4: t0 demoted into main page 0 and kept as the sink
    assert (g.old_sink, g.sink, a.sink) == (None, t0, t0) and g.demote_src == (t0,) and g.freed_tail == ()
    h = host_metadata([(a, g)], False, 4)
    # positions 2, 3 go to main page 0 and to the sink (t0 holds only [0, 2) so far)
    assert h["tail_slots"][:2] == [t0 * 4 + 2, t0 * 4 + 3]
    assert h["main_slots"][:2] == [a.main[0] * 4 + 2, a.main[0] * 4 + 3]
    assert (h["main_lens"], h["tail_lens"], h["prefix_tail"]) == ([0], [2], [t0])  # the old layout
    mgr.finish_growth(g)
    assert pool.tail_alloc.num_used == 1 + len(a.tail)  # the sink stays allocated
    g = mgr.grow(a, 13)  # decode, Lq 4 -> 8: main is read from main[1:], the sink leads the tail
    assert g.freed_tail == g.demote_src and len(g.demote_src) == 1
    h = host_metadata([(a, g)], True, 4)
    assert (h["main_lens"], h["tail_lens"]) == ([4], [9])
    mgr.finish_growth(g)
    g = mgr.grow(a, 20)  # a later extend reads the sink as its first prefix tail page
    h = host_metadata([(a, g)], False, 4)
    assert (h["main_lens"], h["tail_lens"]) == ([4], [9]) and h["prefix_tail"][:2] == [t0, g.old_tail[0]]
    assert all(slot == -1 or slot // 4 != t0 for slot in h["tail_slots"])  # the sink is never rewritten
    mgr.finish_growth(g)
    assert mgr.pages_needed(b, 13) == (2, 3)  # [0, 8) main + page 0's sink, [8, 13) in 2 tail pages
    g = mgr.grow(b, 13)
    assert g.demote_src == () and b.sink is not None and b.sink not in b.tail
    h = host_metadata([(b, g)], False, 4)
    assert h["tail_slots"][:5] == [b.sink * 4 + i for i in range(4)] + [-1] and h["main_slots"][8] == -1
    mgr.finish_growth(g)
    _check_sinks(pool, [a, b], 4)
    mgr.release(a)
    mgr.release(b)
    assert pool.all_free() and pool.tail_alloc.num_used == 0


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
    assert fp8.num_tail_pages == 128 * 5 + 2 * 5  # + old and new window of the chunked prefill
    assert nv.num_tail_pages == 128 * 5 + 2 * 5
    sink = size_pool(kv_dtype=KVDtype.NVFP4, recent_window=64, max_running_requests=128,
                     budget_bytes=budget, max_total_tokens=None, sink_pages=1, **common)  # fmt: skip
    assert sink.sink_pages == 1 and sink.num_tail_pages == 128 * 6 + 2 * 5  # one more page per request
    assert sink.main_bytes() + sink.tail_bytes() <= budget < nv.main_bytes() + sink.tail_bytes()
    for kv, w in ((KVDtype.BF16, 64), (KVDtype.NVFP4, 0)):  # no tail pool: no sink pages
        none = size_pool(kv_dtype=kv, recent_window=w, max_running_requests=128, budget_bytes=budget,
                         max_total_tokens=None, sink_pages=1, **common)  # fmt: skip
        assert none.sink_pages == 0 and none.num_tail_pages == 0
    with pytest.raises(ValueError, match="sink_pages must be 0 or 1"):
        size_pool(kv_dtype=KVDtype.NVFP4, recent_window=64, max_running_requests=1, budget_bytes=budget,
                  max_total_tokens=None, sink_pages=2, **common)  # fmt: skip
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
    assert "tail pages: 12 (fp32, W=8" in lines[0]  # 2 x (2 + 1) + 2 x 3 for the chunked prefill
    assert lines[1] == "max_total_num_tokens=32, max_running_requests=2, context_len=128, page_size=4"
    sink = _pool(num_pages=8, window=8, page=4, max_running=2, sink_pages=1)
    assert "tail pages: 14 (fp32, W=8, sink pages: 1, " in sink.startup_lines(2, 128)[0]


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


@pytest.mark.parametrize("sinks", [0, 1])
def test_page_table_mirrors_page_lists(sinks: int) -> None:
    """After every sync, each request's device row equals the pages attention reads (with a sink page:
    main from page 1, the sink first in the tail row); released rows are reused."""
    from nibblekv.cache import PageTable

    pool = _pool(num_pages=200, window=8, page=4, max_running=3, sink_pages=sinks)
    table = PageTable(3, main_width=64, tail_width=3 + sinks, device=torch.device("cpu"))
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
            main, tail = p.attn_main(), p.attn_tail()
            assert table.main[row, : len(main)].tolist() == main
            assert table.tail[row, : len(tail)].tolist() == tail
            assert (p.sink is not None) == bool(sinks and p.main)
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


def test_prefill_window_keeps_the_previous_chunk_in_the_tail() -> None:
    # W = 8, Wp = 24, pages of 4: non-final chunks keep their newest 24 tokens in bf16, the last chunk
    # demotes down to W at once, and the tail pool is sized for it.
    pool = _pool(num_pages=64, window=8, page=4, max_running=2, prefill_window=24)
    assert pool.spec.prefill_window == 24
    assert pool.spec.num_tail_pages == 2 * (2 + 1) + 2 * (6 + 1)
    mgr = TieredCacheManager(pool)
    pages = RequestPages()
    mgr.finish_growth(mgr.grow(pages, 16, prefilling=True))  # chunk 1: all 16 tokens in the tail
    assert pages.num_main == 0 and len(pages.tail) == 4
    g = mgr.grow(pages, 32, prefilling=True)  # chunk 2 attends to chunk 1 in bf16 (old_tail)
    assert g.prefix_main == 0 and g.prefix_tail == 16 and len(g.old_tail) == 4
    assert pages.num_main == 8 and len(g.demote_src) == 2  # Lq = 32 - 24
    mgr.finish_growth(g)
    assert mgr.pages_needed(pages, 48, prefilling=True) == (4, 4)
    g = mgr.grow(pages, 48)  # the last chunk: reads [8, 32) from the tail, then back to W = 8
    assert g.prefix_main == 8 and g.prefix_tail == 24
    assert pages.num_main == 40 and len(pages.tail) == 2 and len(g.demote_src) == 6
    mgr.finish_growth(g)
    mgr.finish_growth(mgr.grow(pages, 49))  # decode: the window rule as before
    assert pages.num_main == 44 and len(pages.tail) == 2
    mgr.release(pages)
    assert pool.all_free()


def test_prefill_window_defaults_to_the_recent_window() -> None:
    pool = _pool(window=8, page=4, prefill_window=0)
    mgr = TieredCacheManager(pool)
    a, b = RequestPages(), RequestPages()
    mgr.finish_growth(mgr.grow(a, 30, prefilling=True))
    mgr.finish_growth(mgr.grow(b, 30))
    assert (a.num_main, len(a.tail)) == (b.num_main, len(b.tail)) == (24, 2)
    mgr.release(a)
    mgr.release(b)
    no_tail = _pool(window=0, prefill_window=64)  # no tail pool: nothing to keep
    assert no_tail.spec.prefill_window == 0 and no_tail.spec.num_tail_pages == 0


def test_decode_tokens_go_to_the_tail_and_the_backend_skips_the_main_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a bf16 tail every decode token is its request's newest, so it lands in a tail page; the
    backend relies on that to skip the main-pool write launch of decode steps."""
    from nibblekv.attention import paged
    from nibblekv.attention.paged import PagedAttentionBackend, host_metadata, to_device

    pool = _pool(num_pages=32, window=8, page=4)
    mgr = TieredCacheManager(pool)
    a = RequestPages()
    mgr.finish_growth(mgr.grow(a, 13))
    for n in range(14, 30):  # decode, page boundaries and demotions included
        g = mgr.grow(a, n)
        h = host_metadata([(a, g)], True, 4, tail_pool=True)
        assert h["main_slots"] == [-1] and h["tail_slots"][0] >= 0
        mgr.finish_growth(g)
    # a layout that breaks the rule (the newest token in a main page) is refused, not silently dropped
    bad = RequestPages(main=[5], tail=[], num_tokens=3, num_main=4)
    fake = Growth(2, 3, 4, (), (), 4, (), None, None)
    with pytest.raises(RuntimeError, match="main page despite the bf16 tail"):
        host_metadata([(bad, fake)], True, 4, tail_pool=True)
    assert host_metadata([(bad, fake)], True, 4)["main_slots"] == [5 * 4 + 2]  # no tail pool: main write

    written: list[object] = []
    monkeypatch.setattr(paged, "write_kv", lambda k, v, cache, slots, *rest: written.append(cache))
    backend = PagedAttentionBackend(pool)
    d = to_device({"main_slots": [-1], "tail_slots": [7]}, torch.device("cpu"))
    k = torch.zeros(1, 1, 16)
    for is_decode, want in ((True, [pool.tail[0]]), (False, [pool.main[0], pool.tail[0]])):
        backend.meta = SimpleNamespace(is_decode=is_decode, main_slots=d["main_slots"], tail_slots=d["tail_slots"])  # type: ignore[assignment]
        written.clear()
        backend._write(k, k, pool.main[0], pool.tail[0])
        assert written == want


def test_to_device_views_are_16_byte_aligned() -> None:
    # Triton builds a kernel again for a pointer that is not 16-byte aligned: every view of the one buffer
    # (odd and empty lists among them) starts at an even int64 offset and holds exactly its list
    from nibblekv.attention.paged import to_device

    lists = {"a": [1, 2, 3], "b": [], "c": [4], "d": [5, 6], "e": [7, 8, 9]}
    d = to_device(lists, torch.device("cpu"))
    base = d["a"].untyped_storage().data_ptr()
    for name, values in lists.items():
        assert d[name].tolist() == values and d[name].dtype == torch.int64
        assert d[name].untyped_storage().data_ptr() == base  # one host-to-device copy
        assert (d[name].data_ptr() - base) % 16 == 0, name


@pytest.mark.parametrize("window,sinks", [(0, 0), (8, 0), (8, 1), (32, 1)])
def test_decode_fast_path_is_the_full_plan(window: int, sinks: int) -> None:
    """The one-token shortcut of ``_plan`` (no page, no demotion: most decode steps) gives what the tail
    rule's formulas give, step by step through page boundaries, demotions and sink creation; its growths
    change no page list."""
    page = 4
    pool = _pool(num_pages=200, window=window, page=page, sink_pages=sinks)
    mgr = TieredCacheManager(pool)
    rng = random.Random(window * 3 + sinks)
    for prompt in (1, 3, 4, 5, 13):
        pages = RequestPages()
        mgr.finish_growth(mgr.grow(pages, prompt, prefilling=False))
        fast = 0
        for _ in range(45):
            n = pages.num_tokens
            full = mgr._plan_full(pages, n + 1)
            assert mgr._plan(pages, n + 1) == full
            assert mgr.can_grow_all([(pages, n + 1)]) == mgr._fits(full[2], full[3])
            assert mgr._plan(pages, n + 1, prefilling=True) == mgr._plan_full(pages, n + 1, prefilling=True)
            before = (list(pages.main), list(pages.tail), pages.sink)
            g = mgr.try_grow(pages, n + 1)
            assert g is not None and (g.old_len, g.new_len) == (n, n + 1)
            if mgr._plan_full(RequestPages(before[0], before[1], n, g.old_main, before[2]), n + 1)[1:] == (
                0, 0, 0, False,
            ):  # fmt: skip
                fast += 1
                assert (list(pages.main), list(pages.tail), pages.sink) == before
                sink = before[2]
                assert g == Growth(n, n + 1, g.old_main, (), (), g.old_main, tuple(before[1]), sink, sink)
            _check_invariants(pages, page, window)
            mgr.finish_growth(g)
            if rng.random() < 0.1:  # a longer growth now and then (the general path)
                mgr.finish_growth(mgr.grow(pages, pages.num_tokens + rng.randrange(2, 9)))
        assert fast > 30  # most steps took the shortcut
        mgr.release(pages)
    assert pool.all_free()


def test_decode_metadata_fast_path_matches_the_general_loop() -> None:
    """``host_metadata``'s decode path over a bf16 tail fills the same lists as its general loop: sink pages,
    demotions and page boundaries in one batch of requests at different lengths."""
    from nibblekv.attention.paged import host_metadata

    page = 4
    pool = _pool(num_pages=200, window=8, page=page, sink_pages=1, max_running=6)
    mgr = TieredCacheManager(pool)
    reqs = [RequestPages() for _ in range(6)]
    for i, pages in enumerate(reqs):
        mgr.finish_growth(mgr.grow(pages, 1 + 3 * i))
    for _ in range(20):
        batch = [(p, mgr.grow(p, p.num_tokens + 1)) for p in reqs]
        fast = host_metadata(batch, True, page, tail_pool=True)
        general = host_metadata(batch, True, page, tail_pool=False)
        assert fast == general and list(fast) == list(general)
        for _, g in batch:
            mgr.finish_growth(g)
