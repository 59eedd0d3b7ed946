"""Server pieces that need no model: health states, engine-output deltas, admission, body parsing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient

from nibblekv.engine.request import RequestOutput, TokenLogprob
from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.model.tokenizer import ByteTokenizer
from nibblekv.server.app import build_app
from nibblekv.server.engine_api import DeltaReader
from nibblekv.server.errors import APIError
from nibblekv.server.params import ModelLimits
from nibblekv.server.state import Admission, ServerState


class _DeadableEngine:
    """Just enough engine for the health endpoint: ``alive`` is flipped by the test."""

    def __init__(self) -> None:
        self.alive = True
        self.busy = False
        self.tokenizer = ByteTokenizer(300)

    def is_healthy(self) -> bool:
        return self.alive

    def stats(self) -> dict[str, Any]:
        return {"running": 0, "queued": 0}

    async def generate(self, prompt: Any, params: Any, request_id: str | None = None) -> AsyncIterator[Any]:
        raise AssertionError("not used")
        yield

    def abort(self, request_id: str) -> None: ...

    async def flush_cache(self) -> bool:
        return not self.busy

    def shutdown(self) -> None: ...


def _state(engine: _DeadableEngine) -> ServerState:
    return ServerState(
        engine=engine,
        tokenizer=engine.tokenizer,
        model_name="m",
        limits=ModelLimits(64, 300, 64),
        sampling_params=SamplingParams,
        admission=Admission(None),
    )


def test_health_is_503_once_the_engine_is_dead_or_draining() -> None:
    engine = _DeadableEngine()
    state = _state(engine)
    client = TestClient(build_app(state))
    assert client.get("/health").status_code == 200
    engine.alive = False
    dead = client.get("/health")
    assert dead.status_code == 503 and dead.json()["error"]["code"] == 503
    refused = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert refused.status_code == 503 and "not running" in refused.json()["error"]["message"]
    engine.alive, state.draining = True, True
    assert client.get("/health").status_code == 503


def _out(
    ids: list[int], lps: list[TokenLogprob], prompt_lps: list[TokenLogprob] | None, done: bool
) -> RequestOutput:
    return RequestOutput(
        "r",
        "",
        ids,
        done,
        "length" if done else None,
        3,
        len(ids),
        text_delta="x",
        logprobs=lps,
        prompt_logprobs=prompt_lps,
    )


def test_flush_cache_is_200_when_flushed_and_400_while_requests_run() -> None:
    """SGLang's /flush_cache (GET or POST); the engine side is tested in test_prefix_engine.py."""
    engine = _DeadableEngine()
    client = TestClient(build_app(_state(engine)))
    r = client.post("/flush_cache")
    assert r.status_code == 200 and r.text == "Cache flushed.\n"
    assert client.get("/flush_cache").status_code == 200
    engine.busy = True
    r = client.post("/flush_cache")
    assert r.status_code == 400 and "running or waiting" in r.json()["error"]["message"]


class _GeneratingEngine(_DeadableEngine):
    """Generates one output per request, after ``delay`` s, or fails with ``error``."""

    def __init__(self, delay: float = 0.0, error: BaseException | None = None) -> None:
        super().__init__()
        self.delay, self.error, self.prompts = delay, error, []

    async def generate(  # type: ignore[override]
        self, prompt: Any, params: Any, request_id: str | None = None
    ) -> AsyncIterator[Any]:
        import asyncio

        self.prompts.append((prompt, params.max_new_tokens))
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        yield _out([7], [], None, True)


def test_health_generate_runs_one_token_and_fails_on_timeout_or_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang's /health_generate: one token for input_ids=[0] through the engine; 503 when it cannot."""
    import nibblekv.server.app as app_mod

    ok = _GeneratingEngine()
    assert TestClient(build_app(_state(ok))).get("/health_generate").status_code == 200
    assert ok.prompts == [([0], 1)]
    monkeypatch.setattr(app_mod, "HEALTH_GENERATE_TIMEOUT_S", 0.2)
    slow = TestClient(build_app(_state(_GeneratingEngine(delay=5.0)))).get("/health_generate")
    assert slow.status_code == 503 and "within" in slow.json()["error"]["message"]
    broken = _GeneratingEngine(error=RuntimeError("boom"))
    failed = TestClient(build_app(_state(broken))).get("/health_generate")
    assert failed.status_code == 503 and "boom" in failed.json()["error"]["message"]
    dead = _GeneratingEngine()
    dead.alive = False
    assert TestClient(build_app(_state(dead))).get("/health_generate").status_code == 503
    assert dead.prompts == []  # not tried on a dead engine


def test_delta_reader_turns_cumulative_outputs_into_deltas() -> None:
    reader = DeltaReader([5, 6, 7])
    lp = [TokenLogprob(10, -0.1, ((10, -0.1), (11, -2.0))), TokenLogprob(12, -0.5, ((13, -0.4),))]
    prompt_lp = [TokenLogprob(6, -1.0), TokenLogprob(7, -2.0)]
    first = reader.read(_out([10], lp[:1], prompt_lp, False))
    assert first.token_ids == [10] and [e.logprob for e in first.logprobs] == [-0.1]
    assert first.logprobs[0].top == [(10, -0.1), (11, -2.0)]
    assert first.prompt_logprobs is not None
    assert [(e.token_id, e.logprob) for e in first.prompt_logprobs] == [(5, None), (6, -1.0), (7, -2.0)]
    second = reader.read(_out([10, 12], lp, prompt_lp, True))
    assert second.token_ids == [12] and second.logprobs[0].token_id == 12 and second.prompt_logprobs is None
    assert second.finished and second.finish_reason == "length" and second.completion_tokens == 2


def test_admission_limits_and_releases_once() -> None:
    admission = Admission(3)
    release = admission.reserve(2)
    with pytest.raises(APIError) as info:
        admission.reserve(2)
    assert info.value.status == 503
    release()
    release()  # idempotent: a stream closed twice must not free slots it does not hold
    assert admission.in_flight == 0
    with admission.slots(3):
        assert admission.in_flight == 3
    assert admission.in_flight == 0


def test_deep_json_and_surrogates_are_400() -> None:
    client = TestClient(build_app(_state(_DeadableEngine())))
    deep = client.post("/v1/completions", content=b'{"prompt": ' + b"[" * 200 + b"]" * 200 + b"}")
    assert deep.status_code == 400 and "nested deeper" in deep.json()["error"]["message"]
    lone = client.post("/v1/completions", content=b'{"prompt": "\\udc80"}')
    assert lone.status_code == 400 and "not valid unicode" in lone.json()["error"]["message"].lower()


def test_log_requests_logs_arrival_and_finish(caplog: pytest.LogCaptureFixture) -> None:
    state = _state(_GeneratingEngine())
    client = TestClient(build_app(state))
    with caplog.at_level("INFO", logger="nibblekv.server.responses"):
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).status_code == 200
    assert not [
        r for r in caplog.records if r.getMessage().startswith(("Receive:", "Finish:"))
    ]  # off by default
    state.log_requests = True
    with caplog.at_level("INFO", logger="nibblekv.server.responses"):
        assert (
            client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "n": 2}).status_code == 200
        )
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("Receive: cmpl-") and "prompt tokens: 3" in m for m in lines) == 2
    finished = [m for m in lines if m.startswith("Finish: cmpl-")]
    assert len(finished) == 2 and all(
        "finish_reason: length" in m and "completion tokens: 1" in m for m in finished
    )
