"""bf16 sink pages (``--kv-sink-pages``): attention reads page 0 from its bf16 copy in the tail pool.

The backend path (manager -> host metadata -> page table -> kernels) is checked against a dense
reference in which every cached key is quantized except the newest (tail) ones and, with a sink page,
the first ``P``; then the engine flag, its defaults and the start-up line.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from nibblekv.attention.paged import PagedAttentionBackend, to_device
from nibblekv.cache import KVPool, PageTable, RequestPages, TieredCacheManager, size_pool
from nibblekv.config import EngineConfig, add_engine_args
from nibblekv.formats import KVDtype, nvfp4

P, W, D, HQ, HKV = 4, 8, 16, 2, 1


def _setup(sinks: int, max_running: int = 2) -> tuple[TieredCacheManager, PageTable, PagedAttentionBackend]:
    spec = size_pool(
        num_layers=1, num_kv_heads=HKV, head_dim=D, page_size=P, kv_dtype=KVDtype.NVFP4,
        model_kv_dtype=KVDtype.FP32, recent_window=W, max_running_requests=max_running,
        budget_bytes=None, max_total_tokens=64 * P, sink_pages=sinks,
    )  # fmt: skip
    pool = KVPool(spec, "cpu", torch.ones(1, 2))
    table = PageTable(max_running, 64, W // P + 1 + sinks, torch.device("cpu"))
    return TieredCacheManager(pool, table), table, PagedAttentionBackend(pool)


def _expected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Causal attention of the last ``len(q)`` positions over ``k, v [n, HKV, D]``; keys where ``exact``
    is False are read through the NVFP4 round trip (what the main pool stores)."""
    kq = torch.where(exact[:, None, None], k, nvfp4.fake_quantize(k, 1.0))
    vq = torch.where(exact[:, None, None], v, nvfp4.fake_quantize(v, 1.0))
    n, c = k.shape[0], q.shape[0]
    kq, vq = kq.repeat_interleave(HQ // HKV, 1), vq.repeat_interleave(HQ // HKV, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kq) * D**-0.5
    causal = torch.arange(n)[None, :] <= torch.arange(n - c, n)[:, None]
    p = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
    return torch.einsum("hqk,khd->qhd", p, vq)


def _step(
    mgr: TieredCacheManager, table: PageTable, backend: PagedAttentionBackend, reqs: list[RequestPages],
    hist: list[tuple[torch.Tensor, torch.Tensor]], sizes: list[int], sinks: int,
) -> None:  # fmt: skip
    """One forward where request ``i`` stores ``sizes[i]`` new tokens; checks every output row."""
    is_decode = all(n == 1 and p.num_tokens > 0 for n, p in zip(sizes, reqs))
    old = [(p.num_tokens, p.num_main) for p in reqs]
    growths = [mgr.grow(p, p.num_tokens + n) for p, n in zip(reqs, sizes)]
    lists = backend.plan(list(zip(reqs, growths)), is_decode)
    lists["rows"] = table.sync(reqs)
    backend.begin(to_device(lists, torch.device("cpu")), is_decode, table)
    t = sum(sizes)
    q, k, v = torch.randn(t, HQ, D), torch.randn(t, HKV, D) * 2, torch.randn(t, HKV, D)
    out = backend.forward(0, q, k, v)
    for g in growths:
        mgr.finish_growth(g)
    start = 0
    for i, (p, n) in enumerate(zip(reqs, sizes)):
        hk, hv = hist[i]
        hk, hv = torch.cat((hk, k[start : start + n])), torch.cat((hv, v[start : start + n]))
        hist[i] = (hk, hv)
        old_len, old_main = old[i]
        # NOTE: what a query reads quantized: decode, the main pool after the growth; extend, the
        # cached prefix's main part before it. A sink page keeps positions [0, P) exact either way.
        quantized = min(p.num_main, p.num_tokens) if is_decode else min(old_main, old_len)
        pos = torch.arange(p.num_tokens)
        exact = (pos >= quantized) | (pos < P * sinks)
        want = _expected(q[start : start + n], hk, hv, exact)
        assert torch.allclose(out[start : start + n], want, atol=1e-4), (i, sizes, p.num_tokens)
        start += n


# Steps of (tokens for request 0, tokens for request 1): a first chunk that demotes a partly filled
# page 0 (2 then 11), a first chunk longer than W + P (page 0 written straight to the main pool),
# decode steps that demote, and later chunks whose prefix reads the sink page.
SCHEDULE = [(2, 17), (11, 1), (1, 1), (1, 1), (9, 6), (1, 1), (1, 1), (5, 13), (1, 1)]


@pytest.mark.parametrize("sinks", [0, 1])
def test_attention_with_and_without_sink_page_matches_reference(sinks: int) -> None:
    torch.manual_seed(sinks)
    mgr, table, backend = _setup(sinks)
    reqs = [RequestPages(), RequestPages()]
    hist = [(torch.zeros(0, HKV, D), torch.zeros(0, HKV, D)) for _ in reqs]
    for sizes in SCHEDULE:
        _step(mgr, table, backend, reqs, hist, list(sizes), sinks)
        assert all((p.sink is not None) == bool(sinks and p.main) for p in reqs)
    assert all(p.num_main >= 3 * P for p in reqs)  # several quantized pages were read
    for p in reqs:
        mgr.release(p)
    assert mgr.pool.all_free() and mgr.pool.tail_alloc.num_used == 0


def test_sink_page_decode_only_request() -> None:
    """A request that only decodes (one token a step from empty): page 0 is demoted by a decode step."""
    torch.manual_seed(2)
    mgr, table, backend = _setup(1, max_running=1)
    reqs = [RequestPages()]
    hist = [(torch.zeros(0, HKV, D), torch.zeros(0, HKV, D))]
    _step(mgr, table, backend, reqs, hist, [1], 1)  # an extend of one token
    for _ in range(W + 2 * P):
        _step(mgr, table, backend, reqs, hist, [1], 1)
    assert reqs[0].sink is not None and reqs[0].num_main == 3 * P
    mgr.release(reqs[0])
    assert mgr.pool.all_free()


# ---- the flag ---------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nibblekv")
    add_engine_args(p)
    return p


def test_flag_values_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    p = _parser()
    assert EngineConfig.from_args(p.parse_args([])).kv_sink_pages is None  # the per-dtype default
    assert EngineConfig.from_args(p.parse_args(["--kv-sink-pages", "0"])).kv_sink_pages == 0
    assert EngineConfig.from_args(p.parse_args(["--kv-sink-pages", "1"])).kv_sink_pages == 1
    for bad in ("2", "-1", "x"):
        with pytest.raises(SystemExit):
            p.parse_args(["--kv-sink-pages", bad])
        assert "--kv-sink-pages" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--kv-sink-pages must be 0 or 1"):
        EngineConfig(kv_sink_pages=3)


def test_resolved_default_per_dtype() -> None:
    from nibblekv.engine.setup import resolve_sink_pages

    auto = EngineConfig()
    assert resolve_sink_pages(auto, KVDtype.NVFP4) == 1
    assert resolve_sink_pages(auto, KVDtype.FP8) == 0
    assert resolve_sink_pages(auto, KVDtype.BF16) == 0
    assert resolve_sink_pages(EngineConfig(kv_sink_pages=0), KVDtype.NVFP4) == 0
    assert resolve_sink_pages(EngineConfig(kv_sink_pages=1), KVDtype.FP8) == 1


@pytest.mark.slow
def test_engine_pools_and_generation_leave_nothing_behind(smollm2) -> None:  # type: ignore[no-untyped-def]
    from nibblekv.engine import Engine, SamplingParams

    kw = {"loaded": smollm2, "max_total_tokens": 512, "decode_log_interval": 0, "max_running_requests": 4}
    nv = Engine(kv_cache_dtype="nvfp4", chunked_prefill_size=32, **kw)
    spec = nv.pool.spec
    # the default prefill window: the 32-token chunk + W = 96 tokens while a prompt is chunked
    assert spec.sink_pages == 1 and spec.prefill_window == 96
    assert spec.num_tail_pages == 4 * (64 // 16 + 2) + 2 * (96 // 16 + 1)
    assert nv.page_table.tail.shape[1] == 96 // 16 + 1 + 1
    assert "sink pages: 1" in nv.pool.startup_lines(4, 256)[0]
    prompts = [list(range(200, 300)), list(range(300, 390)), list(range(200, 290))]
    outs = nv.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 6 for o in outs)
    assert nv.pool.all_free() and nv.pool.tail_alloc.num_used == 0
    assert Engine(kv_cache_dtype="nvfp4", kv_sink_pages=0, **kw).pool.spec.sink_pages == 0
    assert Engine(kv_cache_dtype="nvfp4", kv_recent_window=0, **kw).pool.spec.sink_pages == 0
    assert Engine(kv_cache_dtype="fp8_e4m3", **kw).pool.spec.sink_pages == 0
    assert Engine(kv_cache_dtype="fp8_e4m3", kv_sink_pages=1, **kw).pool.spec.sink_pages == 1
    assert Engine(kv_cache_dtype="auto", kv_sink_pages=1, **kw).pool.spec.sink_pages == 0
