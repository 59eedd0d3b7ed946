"""Prefix reuse end to end on the bundled SmolLM2 (fp32 on CPU): outputs with the radix cache equal
outputs without it, cached-token counts reach the outputs and stats, the host tier restores evicted
prefixes, and no page ever leaks (every engine's cache is checked and flushed at teardown).

Why the runs compare exactly: with a 64-token prefill chunk the cache-less reference prefills a
request's 64-token shared prefix in one chunk and its question in the next, reading the prefix back
from the cache, which is what the cached run does with the prefix it reuses. For unquantized KV the
chunking does not matter; for NVFP4 it makes both runs read the same stored bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from nibblekv import Engine, SamplingParams
from nibblekv.cache.prefix import PrefixCacheManager
from nibblekv.engine.async_engine import AsyncEngine
from nibblekv.eval.data import DEFAULT_DATA_DIR
from nibblekv.model import CausalLM, Tokenizer

AUSTEN = DEFAULT_DATA_DIR / "pride_and_prejudice.txt"  # the packaged excerpt
PREFIX = 64  # tokens, 4 pages
QUESTIONS = [
    " Who is the first character named here?",
    " Summarize the opening sentence.",
    " Which family is introduced?",
    " What does the narrator claim is universally acknowledged?",
    " Name one place mentioned.",
]
GREEDY = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True, logprobs=1)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Single-threaded: several times faster on a shared CPU box, and batch-shape numerics stay put."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def make_engine(smollm2: tuple[CausalLM, Tokenizer]) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(**kw: object) -> Engine:
        kw.setdefault("max_total_tokens", 4096)
        kw.setdefault("decode_log_interval", 0)
        kw.setdefault("chunked_prefill_size", PREFIX)
        engines.append(Engine(loaded=smollm2, **kw))
        return engines[-1]

    yield make
    for e in engines:
        assert not e.has_unfinished()
        cache = e.scheduler.cache
        if isinstance(cache, PrefixCacheManager):
            cache.check([])  # only the tree holds pages, each exactly once
            cache.flush()
        assert e.pool.all_free(), "pages leaked"


def prompts(tok: Tokenizer, n: int = 4) -> list[list[int]]:
    text = AUSTEN.read_text(encoding="utf-8")
    start = text.index("It is a truth universally acknowledged")
    prefix = tok.encode(text[start : start + 1000])[:PREFIX]
    return [prefix + tok.encode(q) for q in QUESTIONS[:n]]


def run_sequentially(engine: Engine, ps: list[list[int]], params: SamplingParams) -> list:
    return [engine.generate([p], params)[0] for p in ps]


def same(a: list, b: list, tol: float = 0.0) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert all(abs(p.logprob - q.logprob) <= tol for p, q in zip(x.logprobs, y.logprobs))


@pytest.mark.parametrize("kv", ["auto", "bf16", "nvfp4"])
def test_shared_prefix_outputs_equal_without_cache(make_engine, smollm2, kv: str) -> None:
    """Bit-identical when the batches have the same shapes; fp32 KV also batched (to 1e-4)."""
    ps = prompts(smollm2[1], 3)
    ref = run_sequentially(
        make_engine(kv_cache_dtype=kv, kv_recent_window=0, disable_radix_cache=True), ps, GREEDY
    )
    engine = make_engine(kv_cache_dtype=kv, kv_recent_window=0)
    if kv == "auto":
        outs = engine.generate(ps[:1], GREEDY) + engine.generate(
            ps[1:], GREEDY
        )  # both reuse the donor's pages
    else:
        outs = run_sequentially(engine, ps, GREEDY)
    assert [o.cached_tokens for o in outs] == [0, PREFIX, PREFIX]
    assert all(o.cached_tokens == 0 for o in ref)
    same(ref, outs, tol=1e-4 if kv == "auto" else 0.0)
    stats = engine.scheduler.cache.stats
    assert stats.hit_tokens == 2 * PREFIX and stats.lookup_tokens == sum(len(p) for p in ps)


def test_nvfp4_window_reuses_only_what_a_fresh_request_quantizes(make_engine, smollm2) -> None:
    """W > 0: a request reuses quantized pages only below its own Lq, so its prefill reads exactly what
    a W = 0 reference with the chunk boundary there reads; the first sampled token and its logprob agree."""
    ps = prompts(smollm2[1], 2)
    engine = make_engine(kv_cache_dtype="nvfp4", kv_recent_window=32)
    # 16 new tokens: the donor ends with 87 stored, Lq = 64, so its prefix pages are all demoted
    engine.generate([ps[0]], SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True))
    long = (ps[1] + smollm2[1].encode(" Answer in detail and explain every step of your reasoning." * 4))[
        :100
    ]
    short = ps[1][: PREFIX + 8]
    outs = engine.generate([long, short], GREEDY)
    assert [o.cached_tokens for o in outs] == [PREFIX, 48]  # Lq(100) = 80 >= 64, but Lq(72) = 48
    for p, o in zip([long, short], outs):
        ref_engine = make_engine(kv_cache_dtype="nvfp4", kv_recent_window=0, disable_radix_cache=True,
                                 chunked_prefill_size=o.cached_tokens)  # fmt: skip
        ref = ref_engine.generate([p], SamplingParams(temperature=0, max_new_tokens=1, logprobs=1))[0]
        assert ref.token_ids[0] == o.token_ids[0]
        assert abs(ref.logprobs[0].logprob - o.logprobs[0].logprob) <= 1e-4


def test_eviction_in_a_small_pool_keeps_outputs_and_pages(make_engine, smollm2) -> None:
    tok = smollm2[1]
    ps = prompts(tok, 3)
    others = [tok.encode(f"Tell me a story about the number {i}. " * 6)[:56] for i in range(3)]  # 3.5 pages
    mixed = [ps[0], others[0], ps[1], others[1], others[2], ps[2]]
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    ref = make_engine(disable_radix_cache=True, max_total_tokens=2048).generate(mixed, params)
    engine = make_engine(max_total_tokens=128, max_running_requests=2)  # 8 pages: two prompts' worth
    outs = [engine.generate([p], params)[0] for p in mixed]
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert outs[2].cached_tokens == PREFIX  # still cached after one other request
    assert engine.scheduler.cache.tree.num_dropped > 0  # then evicted for the next ones


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_host_tier_restores_evicted_prefix(make_engine, smollm2, policy: str) -> None:
    tok = smollm2[1]
    ps = prompts(tok, 2)
    fillers = [
        tok.encode(f"Write a list of {i} animals and their habitats, one per line.") * 3 for i in range(2)
    ]
    kw = {"kv_cache_dtype": "nvfp4", "kv_recent_window": 0, "max_total_tokens": 96, "max_running_requests": 1}
    ref = run_sequentially(make_engine(disable_radix_cache=True, **kw), [ps[0], *fillers, *ps[1:]], GREEDY)
    engine = make_engine(
        enable_hierarchical_cache=True, hicache_size=0.002, hicache_write_policy=policy, **kw
    )
    outs = run_sequentially(engine, [ps[0], *fillers, *ps[1:]], GREEDY)
    cache = engine.scheduler.cache
    assert cache.tree.num_loaded_back >= PREFIX // 16  # the prefix came back from the host tier
    assert outs[-1].cached_tokens == PREFIX and cache.stats.host_hit_tokens >= PREFIX
    same(ref, outs, tol=1e-4)


def test_preemption_with_prefix_cache(make_engine, smollm2) -> None:
    ps = prompts(smollm2[1], 3)
    params = SamplingParams(temperature=0, max_new_tokens=16, ignore_eos=True)
    ref = make_engine(disable_radix_cache=True).generate(ps, params)
    tiny = make_engine(max_total_tokens=96, chunked_prefill_size=32)
    outs = tiny.generate(ps, params)
    assert tiny.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]


def test_prompt_logprob_requests_are_not_matched(make_engine, smollm2) -> None:
    ps = prompts(smollm2[1], 2)
    engine = make_engine()
    engine.generate([ps[0]], GREEDY)
    scored = engine.generate([ps[1]], SamplingParams(max_new_tokens=1, prompt_logprobs=1))[0]
    assert scored.cached_tokens == 0 and len(scored.prompt_logprobs) == len(ps[1]) - 1


def test_stats_and_flags(smollm2) -> None:
    import argparse
    import asyncio

    from nibblekv.config import EngineConfig, add_engine_args

    ps = prompts(smollm2[1], 2)
    eng = AsyncEngine(
        loaded=smollm2, max_total_tokens=2048, decode_log_interval=0, chunked_prefill_size=PREFIX
    )

    async def last(p: list[int]):  # -> RequestOutput
        out = None
        async for out in eng.generate(p, GREEDY):
            pass
        return out

    async def flush_while_running(p: list[int]) -> bool:
        stream = eng.generate(p, SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True))
        await stream.__anext__()  # running now
        refused = await eng.flush_cache()
        await stream.aclose()  # aborts it
        return refused

    try:
        outs = [asyncio.run(last(p)) for p in ps]
        stats = eng.stats()
        assert asyncio.run(flush_while_running(ps[0])) is False  # its pages are in use
        assert asyncio.run(eng.flush_cache()) is True
        again = asyncio.run(last(ps[1]))
    finally:
        eng.shutdown()
    assert [o.cached_tokens for o in outs] == [0, PREFIX]
    assert again.cached_tokens == 0  # the flush dropped the shared prefix
    assert stats["cached_tokens_total"] == PREFIX
    assert stats["cache_hit_rate"] == pytest.approx(PREFIX / sum(len(p) for p in ps))

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    cfg = EngineConfig.from_args(parser.parse_args([
        "--enable-hierarchical-cache", "--hicache-size", "0.5", "--hicache-write-policy", "write_through",
    ]))  # fmt: skip
    assert (cfg.disable_radix_cache, cfg.enable_hierarchical_cache, cfg.hicache_size) == (False, True, 0.5)
    assert cfg.hicache_write_policy == "write_through"
    assert EngineConfig.from_args(parser.parse_args(["--disable-radix-cache"])).disable_radix_cache
    with pytest.raises(ValueError, match="radix"):
        EngineConfig(disable_radix_cache=True, enable_hierarchical_cache=True)
    with pytest.raises(ValueError, match="write"):
        EngineConfig(hicache_write_policy="write_around")
    with pytest.raises(SystemExit):
        parser.parse_args(["--hicache-write-policy", "write_around"])


def test_chunks_of_a_long_prompt_are_shared_before_it_ends(make_engine, smollm2) -> None:
    """Full pages of each prefill chunk enter the tree at once (SGLang's cache_unfinished_req): a request
    admitted while the donor is still chunking its prompt reuses the chunks already written."""
    tok = smollm2[1]
    long = (prompts(tok, 1)[0] + tok.encode(" And then the story goes on and on." * 30))[: 3 * PREFIX + 5]
    engine = make_engine(kv_cache_dtype="bf16", kv_recent_window=0)
    params = SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True)
    a = engine.add_request(long, params)
    engine.step()  # the donor's first 64-token chunk; each step's budget is one chunk
    b = engine.add_request(long, params)  # admitted with the donor's last 5-token chunk, 3 chunks in
    outs = {}
    while engine.has_unfinished():
        outs.update({o.request_id: o for o in engine.step() if o.finished})
    assert outs[a].cached_tokens == 0 and outs[b].cached_tokens == 3 * PREFIX
    assert outs[b].token_ids == outs[a].token_ids
