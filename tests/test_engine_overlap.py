"""The overlap schedule (``--enable-overlap-schedule``) gives the same tokens as the synchronous loop.

On CPU the "device" step finishes before the host goes on, but every piece of the overlap logic runs:
placeholder tokens, their replacement on the device, late stop checks, dropped tokens of requests that
stopped one step earlier, preemption and abort of requests with pending tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from test_engine_api import TINY

from nibblekv.config import EngineConfig
from nibblekv.engine import Engine, SamplingParams
from nibblekv.engine import model_runner as mr
from nibblekv.engine.request import fill_placeholders, placeholder
from nibblekv.model import load_model

PROMPTS = [[5 + (i * 7 + j) % 200 for j in range(9 + 5 * i)] for i in range(6)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    path = tmp_path_factory.mktemp("tiny-overlap") / "config.json"
    path.write_text(json.dumps({**TINY, "max_position_embeddings": 512}))
    yield load_model(str(path), load_format="dummy", device="cpu", seed=3)


def _engine(tiny: tuple, overlap: bool, **kw: object) -> Engine:
    kw = {"max_total_tokens": 2048, "decode_log_interval": 0, "kv_cache_dtype": "nvfp4", **kw}
    return Engine(loaded=tiny, enable_overlap_schedule=overlap, **kw)


def _run(tiny: tuple, params: list[SamplingParams], **kw: object) -> list[tuple]:
    """(token ids, finish reason, text) per prompt, checked equal with and without overlap."""
    outs, counted = [], []
    for overlap in (False, True):
        e = _engine(tiny, overlap, **kw)
        got = e.generate(PROMPTS[: len(params)], params)
        assert not e.has_unfinished() and e.pool.all_free(), "pages leaked"
        assert all(t >= 0 for o in got for t in o.token_ids)
        outs.append([(o.token_ids, o.finish_reason, o.text) for o in got])
        counted.append(e.stats.generation_tokens)
    assert outs[1] == outs[0]
    assert counted[1] == counted[0]  # the tokens launched past a stop are not counted as generated
    return outs[0]


@pytest.mark.parametrize("kv", ["nvfp4", "bf16"])
def test_overlap_matches_sync_mixed_batch(tiny: tuple, kv: str) -> None:
    # lengths 1 / 2 / 3 / 17 (the last token pending when the request ends), a seeded sampled request,
    # a penalized one and one with logprobs (both synchronous steps, mixed with overlapped ones); two
    # running at a time and 16-token chunks, so prefills interleave with decodes
    params = [
        SamplingParams(temperature=0, max_new_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0, max_new_tokens=2, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=20, seed=7, max_new_tokens=17, ignore_eos=True),
        SamplingParams(temperature=0, max_new_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0, repetition_penalty=1.3, max_new_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0, logprobs=2, max_new_tokens=6, ignore_eos=True),
    ]
    res = _run(tiny, params, kv_cache_dtype=kv, max_running_requests=2, chunked_prefill_size=16)
    assert [len(r[0]) for r in res] == [1, 2, 17, 3, 9, 6]


def test_overlap_stops_one_step_late_but_drops_the_extra_token(tiny: tuple) -> None:
    free = _engine(tiny, False).generate(
        PROMPTS[:3], SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
    )
    tok_stop = free[0].token_ids[5]
    text = free[1].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    params = [
        SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True, stop_token_ids=[tok_stop]),
        SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True, stop=[stop]),
        SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True),
    ]
    res = _run(tiny, params)
    assert res[0][1] == "stop" and res[0][0][-1] == tok_stop and len(res[0][0]) <= 6
    assert res[1][1] == "stop" and stop not in res[1][2]
    assert res[2][1] == "length" and len(res[2][0]) == 24


def test_overlap_min_new_tokens_and_logit_bias_match_sync(tiny: tuple) -> None:
    free = _engine(tiny, False).generate(
        PROMPTS[:2], SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    )
    tok_stop = free[0].token_ids[1]
    params = [
        # the stop id is masked for 6 tokens (synchronous steps), then the request overlaps
        SamplingParams(
            temperature=0, max_new_tokens=12, ignore_eos=True, stop_token_ids=[tok_stop], min_new_tokens=6
        ),
        SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True, logit_bias={tok_stop: 100}),
    ]
    res = _run(tiny, params)
    assert tok_stop not in res[0][0][:6] and (res[0][1] == "length" or res[0][0][-1] == tok_stop)
    assert res[1][0] == [tok_stop] * 5


def test_overlap_prompt_only_requests(tiny: tuple) -> None:
    # max_new_tokens=0: with 4-token chunks the last prompt token runs in a decode step, whose token is dropped
    params = [SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (0, 5, 0)]
    res = _run(tiny, params, chunked_prefill_size=4)
    assert [(len(r[0]), r[1]) for r in res] == [(0, "length"), (5, "length"), (0, "length")]


def test_overlap_preemption_under_a_tiny_pool(tiny: tuple) -> None:
    params = [SamplingParams(temperature=0, max_new_tokens=40, ignore_eos=True)] * 5
    kw = {
        "max_total_tokens": 128,
        "chunked_prefill_size": 16,
        "disable_radix_cache": True,
        "kv_recent_window": 0,
    }
    res = _run(tiny, params, **kw)
    assert all(len(r[0]) == 40 for r in res)
    e = _engine(tiny, True, **kw)
    e.generate(PROMPTS[:5], params)
    assert e.scheduler.num_preemptions > 0


def test_overlap_decode_steps_run_through_launch_and_placeholders(
    tiny: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"launch": 0, "run": 0, "filled": 0}
    real_launch, real_run = mr.ModelRunner.launch, mr.ModelRunner.run

    def fill(ids: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        calls["filled"] += 1
        return fill_placeholders(ids, prev)

    monkeypatch.setattr(
        mr.ModelRunner,
        "launch",
        lambda s, *a: calls.__setitem__("launch", calls["launch"] + 1) or real_launch(s, *a),
    )
    monkeypatch.setattr(
        mr.ModelRunner, "run", lambda s, *a: calls.__setitem__("run", calls["run"] + 1) or real_run(s, *a)
    )
    monkeypatch.setattr(mr, "fill_placeholders", fill)
    e = _engine(tiny, True)
    e.generate(PROMPTS[:2], SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True))
    # one prefill (synchronous), then 9 decode steps launched without waiting, 8 of them fed by placeholders
    assert calls == {"launch": 9, "run": 1, "filled": 8}


def test_overlap_abort_with_a_pending_token(tiny: tuple) -> None:
    e = _engine(tiny, True)
    params = SamplingParams(temperature=0, max_new_tokens=30, ignore_eos=True)
    ids = [e.add_request(p, params) for p in PROMPTS[:3]]
    for _ in range(6):
        e.step()
    req = e._live[ids[1]]
    assert req.num_pending == 1 and req.token_ids[-1] == placeholder(1)
    out = e.abort(ids[1])
    assert out is not None and out.finish_reason == "abort" and all(t >= 0 for t in out.token_ids)
    done = {}
    while e.has_unfinished():
        done.update({o.request_id: o for o in e.step() if o.finished})
    assert len(done[ids[0]].token_ids) == 30 and ids[1] not in done
    assert req.num_pending == 0 and all(t >= 0 for t in req.token_ids)
    assert e.pool.all_free()


def test_fill_placeholders() -> None:
    prev = torch.tensor([40, 41, 42])
    ids = torch.tensor([7, placeholder(2), placeholder(0), 9])
    assert fill_placeholders(ids, prev).tolist() == [7, 42, 40, 9]


def test_overlap_flag_conflicts_are_named() -> None:
    with pytest.raises(ValueError, match="--enable-overlap-schedule"):
        EngineConfig(enable_overlap_schedule=True, tp_size=2)
    EngineConfig(enable_overlap_schedule=True, enable_hierarchical_cache=True)  # opt-in: allowed


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_overlap_with_the_host_tier_matches_sync(tiny: tuple, policy: str) -> None:
    """Rounds of two concurrent requests in an 8-page pool: a shared 3-page prefix, then fillers that push
    it to the host tier, then the prefix again (loaded back while other requests decode): the overlap
    schedule gives the sync loop's tokens, cache hits and host loads."""
    prefix = [7 + (i * 11) % 300 for i in range(48)]
    rounds = [
        [prefix + [1, 2, 3], prefix + [4, 5]],
        [[20 + (i * 13 + j) % 280 for j in range(56)] for i in range(2)],
        [prefix + [6], prefix + [8, 9, 10, 11]],
    ]
    params = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    kw = {"max_total_tokens": 128, "max_running_requests": 2, "kv_recent_window": 0, "chunked_prefill_size": 32,
          "enable_hierarchical_cache": True, "hicache_size": 0.002, "hicache_write_policy": policy}  # fmt: skip
    results = []
    for overlap in (False, True):
        e = _engine(tiny, overlap, **kw)
        assert e.overlap_schedule == overlap
        outs = [[(o.token_ids, o.cached_tokens) for o in e.generate(r, params)] for r in rounds]
        tree = e.scheduler.cache.tree
        assert not e.has_unfinished() and e.pool.all_free(), "pages leaked"
        results.append((outs, tree.num_loaded_back, e.scheduler.cache.stats.host_hit_tokens))
    assert results[1] == results[0]
    outs, loaded, host_hits = results[0]
    assert loaded >= 3 and host_hits >= 48 and all(c >= 48 for _, c in outs[2])


def test_overlap_default_is_on_for_one_cuda_gpu_only() -> None:
    """SGLang's default: on unless disabled, for a single CUDA GPU (not with tensor parallelism, which it
    cannot run, nor by default with the host tier, not yet timed together); off on CPU, where nothing runs
    asynchronously to hide the host's work behind."""
    auto = EngineConfig()
    assert auto.enable_overlap_schedule is None
    assert auto.overlap_schedule("cuda") and not auto.overlap_schedule("cpu")
    assert not EngineConfig(tp_size=2).overlap_schedule("cuda")
    assert not EngineConfig(enable_hierarchical_cache=True).overlap_schedule("cuda")  # until timed there
    assert EngineConfig(enable_hierarchical_cache=True, enable_overlap_schedule=True).overlap_schedule("cuda")
    assert not EngineConfig(enable_overlap_schedule=False).overlap_schedule("cuda")
    assert EngineConfig(enable_overlap_schedule=True).overlap_schedule("cpu")


def test_overlap_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from nibblekv.config import add_engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    parse = lambda *a: EngineConfig.from_args(parser.parse_args(list(a)))  # noqa: E731
    assert parse().enable_overlap_schedule is None
    assert parse("--enable-overlap-schedule").enable_overlap_schedule is True
    assert parse("--disable-overlap-schedule").enable_overlap_schedule is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--enable-overlap-schedule", "--disable-overlap-schedule"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_overlap_never_preempts_or_aborts_on_a_pending_token(tiny: tuple) -> None:
    """Out of pages, the next decode would preempt (or, alone, abort) a request whose pending token may be
    its stop token: the pending step is resolved first, so outputs and preemptions equal the sync loop's."""
    kw = {"max_total_tokens": 32, "disable_radix_cache": True, "kv_recent_window": 0, "kv_cache_dtype": "bf16"}
    prompt = [10 + i for i in range(20)]  # 20 tokens of a 32-token pool: 13 outputs (the last is not stored)
    free = _engine(tiny, False, **kw).generate(prompt, SamplingParams(temperature=0, max_new_tokens=100, ignore_eos=True))[0]
    assert free.finish_reason == "abort" and len(free.token_ids) == 13
    stop = free.token_ids[-1]
    assert stop not in free.token_ids[:-1]
    sp = SamplingParams(temperature=0, max_new_tokens=100, ignore_eos=True, stop_token_ids=[stop])
    for overlap in (False, True):  # the 13th token stops it, exactly when the pool is full
        e = _engine(tiny, overlap, **kw)
        out = e.generate(prompt, sp)[0]
        assert (out.finish_reason, out.token_ids) == ("stop", free.token_ids), overlap
        assert e.pool.all_free()
    kw = {**kw, "max_total_tokens": 64, "max_running_requests": 2}
    prompts = [PROMPTS[0], PROMPTS[1]]
    free2 = _engine(tiny, False, **kw).generate(prompts, SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True))
    sps = [SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True, stop_token_ids=[free2[0].token_ids[20]]),
           SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True)]  # fmt: skip
    runs = []
    for overlap in (False, True):
        e = _engine(tiny, overlap, **kw)
        outs = e.generate(prompts, sps)
        runs.append((e.scheduler.num_preemptions, [(o.token_ids, o.finish_reason) for o in outs]))
        assert e.pool.all_free()
    assert runs[1] == runs[0]
