"""The drain's decisions without a server: wait while requests finish, abort what is left at the timeout
(or at a second signal), refuse new requests meanwhile. The real-server case: test_server_drain.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("uvicorn")
import uvicorn

from nibblekv.engine.sampling_params import SamplingParams
from nibblekv.model.tokenizer import ByteTokenizer
from nibblekv.server.errors import APIError
from nibblekv.server.formatting import ChoiceState
from nibblekv.server.launch import _DrainingServer
from nibblekv.server.params import ModelLimits
from nibblekv.server.responses import admit, check_not_shut_down
from nibblekv.server.state import Admission, ServerState


class _AbortingEngine:
    """Records aborts; an abort ends its request (releases its admission slot), as the engine's does."""

    def __init__(self) -> None:
        self.tokenizer = ByteTokenizer(300)
        self.aborted: list[str] = []
        self.releases: dict[str, Callable[[], None]] = {}

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.releases.pop(request_id)()


def _server(drain_timeout: float) -> tuple[_DrainingServer, ServerState, _AbortingEngine]:
    engine = _AbortingEngine()
    state = ServerState(
        engine=engine,  # type: ignore[arg-type]
        tokenizer=engine.tokenizer,
        model_name="m",
        limits=ModelLimits(64, 300, 64),
        sampling_params=SamplingParams,
        admission=Admission(None),
    )
    return _DrainingServer(uvicorn.Config(app=None), state, drain_timeout), state, engine


def _start(state: ServerState, engine: _AbortingEngine, request_id: str) -> Callable[[], None]:
    release = admit(state, 1)
    state.live_requests[request_id] = request_id

    def done() -> None:
        state.live_requests.pop(request_id, None)
        release()

    engine.releases[request_id] = done
    return done


def test_drain_waits_for_requests_that_finish_in_time() -> None:
    server, state, engine = _server(drain_timeout=5.0)
    done = _start(state, engine, "a")

    async def run() -> float:
        state.draining = True
        asyncio.get_running_loop().call_later(0.3, done)
        t0 = time.monotonic()
        await server._drain()
        return time.monotonic() - t0

    took = asyncio.run(run())
    assert 0.25 < took < 2.0 and server.should_exit
    assert engine.aborted == [] and not state.drain_expired


def test_drain_aborts_what_is_left_at_the_timeout_and_refuses_new_requests() -> None:
    server, state, engine = _server(drain_timeout=0.3)
    _start(state, engine, "a")
    _start(state, engine, "b")
    state.draining = True
    with pytest.raises(APIError) as refused:
        admit(state, 1)
    assert refused.value.status == 503

    t0 = time.monotonic()
    asyncio.run(server._drain())
    assert 0.25 < time.monotonic() - t0 < 2.0 and server.should_exit
    assert sorted(engine.aborted) == ["a", "b"] and state.drain_expired
    assert state.admission.in_flight == 0

    cut = ChoiceState(0, [1])
    cut.finish_reason = "abort"
    with pytest.raises(APIError) as shut:
        check_not_shut_down(state, [cut])
    assert shut.value.status == 503


def test_a_second_signal_ends_the_drain_at_once() -> None:
    server, state, engine = _server(drain_timeout=60.0)
    _start(state, engine, "a")

    async def run() -> float:
        state.draining = True
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, lambda: setattr(server, "_cut_short", True))
        t0 = time.monotonic()
        await server._drain()
        return time.monotonic() - t0

    assert asyncio.run(run()) < 2.0
    assert engine.aborted == ["a"] and server.should_exit


def test_a_finished_request_is_no_503() -> None:
    _, state, _ = _server(drain_timeout=1.0)
    state.drain_expired = True
    whole: Any = ChoiceState(0, [1])
    whole.finish_reason = "length"
    check_not_shut_down(state, [whole])
