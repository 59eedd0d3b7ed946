"""Host tier: stored-form page round trips (NVFP4 data + scales, FP8, bf16), sizing, and the prefix
manager with the host tier under memory pressure (no page leaks, bytes restored exactly)."""

from __future__ import annotations

import random

import pytest
import torch

from nibblekv.cache import KVPool, RequestPages, size_pool
from nibblekv.cache.host_tier import HostTier, _runs, host_page_bytes, host_pages_for
from nibblekv.cache.prefix import PrefixCacheManager
from nibblekv.formats import KVDtype

P = 4


def make_pool(dtype: KVDtype, num_pages: int = 16, layers: int = 3, window: int = 0) -> KVPool:
    spec = size_pool(
        num_layers=layers, num_kv_heads=2, head_dim=32, page_size=P, kv_dtype=dtype,
        model_kv_dtype=KVDtype.FP32, recent_window=window, max_running_requests=4, budget_bytes=None,
        max_total_tokens=num_pages * P,
    )  # fmt: skip
    return KVPool(spec, "cpu", torch.rand(layers, 2) + 0.5)


def page_bytes(pool: KVPool, page: int) -> list[torch.Tensor]:
    """Every stored byte of one main-pool page, all layers, K/V data and scales."""
    out = []
    for layer in pool.main:
        for t in (layer.k_data, layer.v_data, layer.k_scale, layer.v_scale):
            if t is not None:
                out.append(t[page].contiguous().view(torch.uint8).clone())
    return out


def randomize(pool: KVPool, gen: torch.Generator) -> None:
    for layer in pool.main:
        for t in (layer.k_data, layer.v_data, layer.k_scale, layer.v_scale):
            if t is not None:
                raw = torch.randint(0, 256, t.shape[:-1] + (t.shape[-1] * t.element_size(),), generator=gen)
                t.view(torch.uint8).copy_(raw.to(torch.uint8))


@pytest.mark.parametrize("dtype", [KVDtype.NVFP4, KVDtype.FP8, KVDtype.BF16])
def test_round_trip_restores_identical_pages(dtype: KVDtype) -> None:
    pool = make_pool(dtype)
    gen = torch.Generator().manual_seed(0)
    randomize(pool, gen)
    host = HostTier(pool, 10)
    src = [3, 7, 8, 9, 1]
    before = {p: page_bytes(pool, p) for p in src}
    slots = host.alloc.alloc(5)
    host.write(src, slots).wait()
    randomize(pool, gen)  # the device pages are reused for something else meanwhile
    dst = [12, 2, 5, 6, 15]
    load = host.load(slots, dst)
    load.wait_layer(0)
    load.wait()
    assert load.done()
    for s, d in zip(src, dst):
        for a, b in zip(before[s], page_bytes(pool, d)):
            assert torch.equal(a, b)
    # global scales are the pool's, untouched; other pages untouched by the load
    untouched = [p for p in range(1, 17) if p not in dst]
    snapshot = {p: page_bytes(pool, p) for p in untouched}
    host.load(slots[:1], [dst[0]])
    assert all(torch.equal(a, b) for p in untouched for a, b in zip(snapshot[p], page_bytes(pool, p)))


def test_sizes_and_runs() -> None:
    pool = make_pool(KVDtype.NVFP4, layers=3)
    # per token per layer: K+V, 2 heads, 32/2 data bytes + 32/16 scale bytes
    assert host_page_bytes(pool.spec) == P * 3 * 2 * 2 * (16 + 2)
    assert HostTier(pool, 5).page_bytes == host_page_bytes(pool.spec)
    assert host_pages_for(pool.spec, 1.0) == (1 << 30) // host_page_bytes(pool.spec)
    assert _runs([4, 5, 6, 9, 10, 2]) == [(4, 0, 3), (9, 3, 2), (2, 5, 1)]
    with pytest.raises(ValueError):
        HostTier(pool, 0)
    with pytest.raises(ValueError):
        HostTier(pool, 4).write([1, 2], [1])


def _store(mgr: PrefixCacheManager, pages: RequestPages, tokens: list[int], gen: torch.Generator) -> None:
    """Stand-in for a forward: grow to all tokens and write 'K/V' that depend only on (token, position)."""
    g = mgr.grow(pages, len(tokens))
    for pos in range(g.old_len, g.new_len):
        in_main, slot = pages.slot(pos, mgr.page_size)
        assert in_main  # W = 0
        for layer_id, layer in enumerate(mgr.pool.main):
            seed = (tokens[pos] * 1000003 + pos * 7919 + layer_id) % (1 << 31)
            row = torch.randint(0, 256, (2, layer.k_data.shape[1], layer.k_data.shape[-1]),
                                generator=torch.Generator().manual_seed(seed)).to(torch.uint8)  # fmt: skip
            layer.k_data[slot // P, :, slot % P] = row[0]
            layer.v_data[slot // P, :, slot % P] = row[1]
    mgr.finish_growth(g)


def _read(mgr: PrefixCacheManager, pages: RequestPages, n: int) -> torch.Tensor:
    return torch.stack([
        torch.stack([layer.k_data[pages.main[i // P], :, i % P] for i in range(n)]) for layer in mgr.pool.main
    ])  # fmt: skip


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_manager_with_host_tier_under_pressure(policy: str) -> None:
    """Sessions that outgrow the device pool come back through the host tier with identical bytes."""
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(0)
    pool = make_pool(KVDtype.NVFP4, num_pages=12, layers=2)
    mgr = PrefixCacheManager(pool, host=HostTier(pool, 40), write_policy=policy)
    # 4 sessions, each growing by whole turns; the device pool holds about one session at a time.
    history = {s: [rng.randrange(1000) for _ in range(10)] for s in range(4)}
    fresh_bytes: dict[int, torch.Tensor] = {}
    host_hits = 0
    for turn in range(4):
        for s in range(4):
            tokens = history[s] = history[s] + [rng.randrange(1000) for _ in range(6)]
            pages = RequestPages()
            cached = mgr.match_prefix(pages, tokens)
            assert cached % P == 0 and cached < len(tokens)
            assert mgr.can_grow(pages, len(tokens))
            host_hits += mgr.tree.num_loaded_back
            mgr.take_loads()
            if cached:  # the reused pages hold the bytes this session's tokens produced before
                assert torch.equal(_read(mgr, pages, cached), fresh_bytes[s][:, :cached])
            _store(mgr, pages, tokens, gen)
            fresh_bytes[s] = _read(mgr, pages, len(tokens) // P * P)
            mgr.cache_prefix(pages, tokens)
            mgr.check([pages])
            mgr.release(pages, tokens)
            mgr.check([])
    assert mgr.tree.num_loaded_back > 0 and mgr.stats.host_hit_tokens > 0
    assert mgr.stats.hit_rate > 0.3
    mgr.flush()
    mgr.check([])
    assert pool.main_alloc.num_used == 0 and mgr.tree.host is not None and mgr.tree.host.alloc.num_used == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_side_stream_round_trip() -> None:  # pragma: no cover - GPU only
    spec = make_pool(KVDtype.NVFP4).spec
    pool = KVPool(spec, "cuda", torch.ones(spec.num_layers, 2))
    for layer in pool.main:
        layer.k_data.random_(0, 256)
    host = HostTier(pool, 8)
    assert host._host[0].is_pinned()
    before = pool.main[0].k_data[[1, 2]].clone()
    host.write([1, 2], [3, 4]).wait()
    pool.main[0].k_data[[1, 2]] = 0
    t = host.load([3, 4], [5, 6])
    for i in range(spec.num_layers):
        t.wait_layer(i)
    assert torch.equal(pool.main[0].k_data[[5, 6]], before)
