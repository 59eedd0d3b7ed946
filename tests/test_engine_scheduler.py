"""Scheduler behaviour with a stand-in model (tokens are a function of the context), no weights needed."""

from __future__ import annotations

import pytest
import torch

from nibblekv.cache import KVPool, TieredCacheManager, size_pool
from nibblekv.engine.request import Request, RequestStatus
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.engine.scheduler import Scheduler, StepResult
from nibblekv.formats import KVDtype

PAGE = 4


def _scheduler(num_pages: int, window: int, max_running: int, chunk: int | None, sinks: int = 0) -> Scheduler:
    spec = size_pool(
        num_layers=1, num_kv_heads=1, head_dim=16, page_size=PAGE, kv_dtype=KVDtype.NVFP4,
        model_kv_dtype=KVDtype.FP32, recent_window=window, max_running_requests=max_running,
        budget_bytes=None, max_total_tokens=num_pages * PAGE, sink_pages=sinks,
    )  # fmt: skip
    pool = KVPool(spec, "cpu", torch.ones(1, 2))
    return Scheduler(
        TieredCacheManager(pool), max_running_requests=max_running, chunk_tokens=chunk, eos_token_ids=[1]
    )


def _next_token(req: Request) -> int:
    """What a deterministic model would answer: depends only on the request's tokens so far."""
    return 2 + (sum(req.token_ids) * 31 + len(req.token_ids)) % 97


def _requests(n: int, prompt_len: int, new: int) -> list[Request]:
    params = SamplingParams(max_new_tokens=new, ignore_eos=True)
    return [
        Request(f"r{i}", [3 + (i * 7 + j) % 50 for j in range(prompt_len + i)], params, new) for i in range(n)
    ]


def _drive(sched: Scheduler, reqs: list[Request]) -> dict[str, int]:
    """Run to completion, checking the bookkeeping after every step."""
    for r in reqs:
        sched.add(r)
    pool = sched.cache.pool
    seen = {"steps": 0, "max_running": 0, "extend_tokens": 0}
    finished: list[Request] = []
    while sched.has_work():
        batch = sched.schedule()
        if batch is None:  # legitimate only when scheduling itself ended a request
            ended = sched.take_finished()
            assert ended, "scheduler stalled"
            finished.extend(ended)
            continue
        if not batch.is_decode and sched.chunk_tokens:
            assert batch.num_tokens <= sched.chunk_tokens
        if not batch.is_decode:
            seen["extend_tokens"] = max(seen["extend_tokens"], batch.num_tokens)
        toks = [_next_token(r) for i, r in enumerate(batch.reqs) if batch.samples(i)]
        sched.postprocess(batch, StepResult(toks, [None] * len(toks), {}))
        finished.extend(sched.take_finished())
        seen["steps"] += 1
        seen["max_running"] = max(seen["max_running"], len(sched.running))
        # NOTE: every allocated page belongs to exactly one running request.
        assert pool.main_alloc.num_used == sum(len(r.pages.main) for r in sched.running)
        assert pool.tail_alloc.num_used == sum(len(r.pages.attn_tail()) for r in sched.running)  # + sinks
        assert len({id(r) for r in sched.running} | {id(r) for r in sched.waiting}) == len(
            sched.running
        ) + len(sched.waiting)
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in reqs)  # each exactly once
    assert pool.all_free()
    return seen


def _expected(req: Request) -> list[int]:
    ref = Request("x", req.token_ids[: req.num_prompt_tokens], req.params, req.max_new_tokens)
    while ref.num_output_tokens < ref.max_new_tokens:
        ref.token_ids.append(_next_token(ref))
    return ref.output_token_ids


@pytest.mark.parametrize("window,sinks", [(0, 0), (8, 0), (8, 1)])
def test_preemption_loses_and_duplicates_nothing(window: int, sinks: int) -> None:
    sched = _scheduler(num_pages=24, window=window, max_running=8, chunk=16, sinks=sinks)
    reqs = _requests(8, prompt_len=10, new=30)
    expected = {r.request_id: _expected(r) for r in reqs}
    _drive(sched, reqs)
    assert sched.num_preemptions > 0  # the pool is too small for all 8 at once
    for r in reqs:
        assert r.finish_reason == "length" and r.output_token_ids == expected[r.request_id]


def test_chunked_prefill_budget_and_fcfs() -> None:
    sched = _scheduler(num_pages=200, window=8, max_running=2, chunk=8)
    reqs = _requests(3, prompt_len=21, new=3)
    admitted: list[str] = []
    for r in reqs:
        sched.add(r)
    while sched.has_work():
        batch = sched.schedule()
        assert batch is not None
        for r in batch.reqs:
            if r.request_id not in admitted:
                admitted.append(r.request_id)
        toks = [_next_token(r) for i, r in enumerate(batch.reqs) if batch.samples(i)]
        sched.postprocess(batch, StepResult(toks, [None] * len(toks), {}))
        assert len(sched.running) <= 2
    assert admitted == ["r0", "r1", "r2"]
    assert all(r.output_token_ids == _expected(r) for r in reqs)


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_lpm_admits_the_longest_cached_prefix_first(policy: str) -> None:
    from nibblekv.cache.prefix import PrefixCacheManager

    spec = size_pool(
        num_layers=1, num_kv_heads=1, head_dim=16, page_size=PAGE, kv_dtype=KVDtype.BF16,
        model_kv_dtype=KVDtype.FP32, recent_window=0, max_running_requests=1, budget_bytes=None,
        max_total_tokens=64 * PAGE,
    )  # fmt: skip
    sched = Scheduler(
        PrefixCacheManager(KVPool(spec, "cpu", torch.ones(1, 2))), max_running_requests=1, chunk_tokens=None,
        eos_token_ids=[1], policy=policy,
    )  # fmt: skip
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    shared = [3 + j % 40 for j in range(13)]
    donor = Request("donor", shared + [44, 45], params, 3)
    cold = Request("cold", [50 + j for j in range(9)], params, 3)  # no cached prefix; arrives first
    near = Request("near", shared + [7], params, 3)  # 3 cached pages (12 tokens)
    scored = Request("scored", shared + [8], SamplingParams(max_new_tokens=1, prompt_logprobs=1), 1)
    order: list[str] = []
    for batch_reqs in ([donor], [cold, scored, near]):
        for r in batch_reqs:
            sched.add(r)
        while sched.has_work():
            batch = sched.schedule()
            assert batch is not None
            order += [r.request_id for r in batch.reqs if r.request_id not in order]
            toks = [_next_token(r) for i, r in enumerate(batch.reqs) if batch.samples(i)]
            sched.postprocess(batch, StepResult(toks, [None] * len(toks), {}))
    # lpm: "near" jumps the queue; "scored" (prompt logprobs: never matched) keeps its FCFS place after "cold"
    want = ["donor", "near", "cold", "scored"] if policy == "lpm" else ["donor", "cold", "scored", "near"]
    assert order == want
    assert near.cached_tokens == 12 and cold.cached_tokens == 0
    assert all(r.output_token_ids == _expected(r) for r in (donor, cold, near))
    with pytest.raises(ValueError, match="schedule policy"):
        Scheduler(sched.cache, max_running_requests=1, chunk_tokens=None, eos_token_ids=[1], policy="lifo")
    if policy == "lpm":  # lookups are kept while the tree's version holds, redone after it changes
        calls: list[str] = []
        peek = sched.cache.peek_prefix
        sched.cache.peek_prefix = lambda t: calls.append("peek") or peek(t)  # type: ignore[method-assign]
        for i in range(3):
            sched.add(Request(f"w{i}", shared + [i], params, 3))
        version = sched.cache.prefix_version
        sched._order_by_prefix()
        sched._order_by_prefix()
        assert len(calls) == 3 and sched.cache.prefix_version == version
        sched.cache.tree.evict(1)
        sched._order_by_prefix()
        assert len(calls) == 6 and sched.cache.prefix_version > version


def test_stop_conditions() -> None:
    sched = _scheduler(num_pages=50, window=0, max_running=4, chunk=None)
    eos = Request("eos", [5, 6], SamplingParams(max_new_tokens=10), 10)
    stop_id = Request("stop_id", [5, 6], SamplingParams(max_new_tokens=10, stop_token_ids=[9]), 10)
    ignore = Request("ignore", [5, 6], SamplingParams(max_new_tokens=3, ignore_eos=True), 3)
    zero = Request("zero", [5, 6], SamplingParams(max_new_tokens=0), 0)
    for r in (eos, stop_id, ignore, zero):
        sched.add(r)
    script = {"eos": [4, 1], "stop_id": [9], "ignore": [1, 1, 1], "zero": [7]}
    while sched.has_work():
        batch = sched.schedule()
        assert batch is not None
        toks = [script[r.request_id].pop(0) for i, r in enumerate(batch.reqs) if batch.samples(i)]
        sched.postprocess(batch, StepResult(toks, [None] * len(toks), {}))
    assert (eos.finish_reason, eos.output_token_ids) == ("stop", [4, 1])
    assert (stop_id.finish_reason, stop_id.output_token_ids) == ("stop", [9])
    assert (ignore.finish_reason, ignore.output_token_ids) == ("length", [1, 1, 1])
    assert (zero.finish_reason, zero.output_token_ids) == ("length", [])
    assert sched.cache.pool.all_free()


def test_lone_request_that_cannot_fit_is_aborted() -> None:
    sched = _scheduler(num_pages=3, window=0, max_running=1, chunk=None)
    (req,) = _requests(1, prompt_len=10, new=50)
    seen = _drive(sched, [req])
    assert req.finish_reason == "abort" and req.status is RequestStatus.FINISHED
    assert req.num_output_tokens == 3 and seen["steps"] == 3  # 12 slots: prompt 10 + 2 stored + 1 sampled


def test_schedule_policy_flag() -> None:
    import argparse

    from nibblekv.config import EngineConfig, add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert EngineConfig.from_args(parser.parse_args([])).schedule_policy == "fcfs"
    assert EngineConfig.from_args(parser.parse_args(["--schedule-policy", "lpm"])).schedule_policy == "lpm"
    with pytest.raises(SystemExit):
        parser.parse_args(["--schedule-policy", "lifo"])
    with pytest.raises(ValueError, match="--schedule-policy"):
        EngineConfig(schedule_policy="lifo")
