"""Pieces shared by the completion handlers: model check, admission, running the choices' engine requests,
metrics at finish, SSE and disconnects."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from nibblekv.server.engine_api import Delta
from nibblekv.server.errors import APIError, error_body
from nibblekv.server.formatting import ChoiceState
from nibblekv.server.generation import GenerationJob, merged_streams, stop_on_disconnect, unless_disconnected
from nibblekv.server.metrics import TokenTimer
from nibblekv.server.protocol import make_id
from nibblekv.server.state import ServerState

log = logging.getLogger(__name__)
T = TypeVar("T")


def check_model(state: ServerState, model: str | None) -> None:
    """Accept the served model's name, its path, or no name; anything else is a 404 like OpenAI's."""
    if model is None or model in (state.model_name, state.model_info.get("model_path"), "default"):
        return
    raise APIError(
        f"The model `{model}` does not exist. This server serves `{state.model_name}`.",
        status=404,
        param="model",
    )


def admit(state: ServerState, count: int) -> Callable[[], None]:
    """Reserve ``count`` engine requests, or 503 while the server drains (as SGLang does at shutdown, so
    a router sends the request elsewhere); returns the idempotent release function."""
    if state.draining:
        raise APIError("The server is shutting down; send the request to another replica.", status=503)
    return state.admission.reserve(count)


def check_not_shut_down(state: ServerState, choices: Iterable[ChoiceState]) -> None:
    """A non-streaming request the drain timeout cut short is a 503, not a partial answer."""
    if state.drain_expired and any(c.finish_reason == "abort" for c in choices):
        raise APIError(
            "The server shut down before the request finished (aborted at the drain timeout).", status=503
        )


def finish_metrics(state: ServerState, choice: ChoiceState, timer: TokenTimer) -> None:
    """Count a finished generation's tokens and latency."""
    timer.on_finish()
    state.metrics.record_finished(choice.prompt_tokens, choice.completion_tokens, choice.cached_tokens)
    state.metrics.requests.labels(outcome=choice.finish_reason or "stop").inc()


async def respond(request: Request, work: Awaitable[T]) -> T:
    """Await a non-streaming generation, aborting it if the client disconnects (then 499)."""
    return await unless_disconnected(request, work)


@dataclass(frozen=True)
class Generation:
    """One request's choices: the engine requests (``jobs``) that fill them, their outputs (``choices``,
    by choice index) and the response id ``rid``."""

    jobs: list[GenerationJob]
    choices: dict[int, ChoiceState]
    rid: str

    @classmethod
    def of(
        cls,
        prompts: Iterable[tuple[list[int], Any, int]],
        n: int,
        id_prefix: str,
        client_ids: Sequence[str] | None = None,
    ) -> Generation:
        """``n`` choices per (prompt ids, sampling params, most new tokens); choice index = prompt index
        * n + j, as in OpenAI. The response id is ``id_prefix``-fresh (``protocol.make_id``); the client
        knows each choice by ``client_ids[index]`` where given, else by that id (``GenerationJob``).

        NOTE: a seeded request's choice ``j`` samples with ``seed + j`` (as vLLM's parallel sampling): the
        same seed for all would make the ``n`` choices one choice ``n`` times."""
        jobs: list[GenerationJob] = []
        choices: dict[int, ChoiceState] = {}
        rid = make_id(id_prefix)
        for p, (ids, params, max_new) in enumerate(prompts):
            for j in range(n):
                index = p * n + j
                seed = getattr(params, "seed", None)
                own = replace(params, seed=seed + j) if seed is not None and j else params
                jobs.append(GenerationJob(index, ids, own, client_ids[index] if client_ids else rid))
                choices[index] = ChoiceState(index, ids, drop_output=max_new == 0)
        return cls(jobs, choices, rid)


async def observed(state: ServerState, gen: Generation) -> AsyncIterator[tuple[ChoiceState, Delta, Delta]]:
    """Run the engine requests of ``gen``: every delta as (its choice, the delta, what it adds to the
    choice's output), once folded into the choice with its latency and tokens recorded (at the end, the
    finish: :func:`finish_metrics`)."""
    timers = {job.index: TokenTimer(state.metrics) for job in gen.jobs}
    if state.log_requests:
        for job in gen.jobs:
            prompt = len(job.prompt_ids)
            log.info("Receive: %s[%d], prompt tokens: %d, %s", gen.rid, job.index, prompt, job.params)
    started = time.perf_counter()
    async for index, delta in merged_streams(state.engine, gen.jobs, state.live_requests):
        choice, timer = gen.choices[index], timers[index]
        timer.on_tokens(len(delta.token_ids))
        shown = choice.apply(delta)
        if delta.finished:
            finish_metrics(state, choice, timer)
            if state.log_requests:
                log.info(
                    "Finish: %s[%d], finish_reason: %s, prompt tokens: %d, completion tokens: %d, cached "
                    "tokens: %d, e2e latency: %.3f s",
                    gen.rid, index, choice.finish_reason, choice.prompt_tokens, choice.completion_tokens,
                    choice.cached_tokens, time.perf_counter() - started,
                )  # fmt: skip
        yield choice, delta, shown


async def _run(state: ServerState, gen: Generation) -> None:
    async for _ in observed(state, gen):
        pass


async def run_to_end(request: Request, state: ServerState, gen: Generation) -> None:
    """Admit and run a non-streaming request's generations; then ``gen.choices`` hold their outputs."""
    release = admit(state, len(gen.jobs))
    try:
        await respond(request, _run(state, gen))
    finally:
        release()
    check_not_shut_down(state, gen.choices.values())


def stream_response(
    request: Request, state: ServerState, gen: Generation, payloads: AsyncIterator[str]
) -> StreamingResponse:
    """Admit a streaming request's generations and answer with the server-sent events of ``payloads``
    (which run them through :func:`observed`)."""
    return sse_response(request, payloads, admit(state, len(gen.jobs)))


class _ReleasingStream(StreamingResponse):
    """A streaming response that releases its admission slots however the stream ends."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


async def _sse_events(
    request: Request, payloads: AsyncIterator[str], release: Callable[[], None]
) -> AsyncIterator[str]:
    """``data: ...`` events, an error event if generation fails, and always ``data: [DONE]``."""
    try:
        async for payload in stop_on_disconnect(request, payloads):
            yield f"data: {payload}\n\n"
    except APIError as exc:
        yield f"data: {json.dumps(error_body(exc.message, exc.status, exc.param))}\n\n"
    except ValueError as exc:  # the engine rejected the request (validation it alone can do)
        yield f"data: {json.dumps(error_body(str(exc), 400))}\n\n"
    except Exception as exc:  # the stream has started: report in-band, then end cleanly
        log.exception("error while streaming")
        yield f"data: {json.dumps(error_body(f'internal server error: {type(exc).__name__}', 500))}\n\n"
    finally:
        release()
    yield "data: [DONE]\n\n"


def sse_response(
    request: Request, payloads: AsyncIterator[str], release: Callable[[], None]
) -> StreamingResponse:
    """A server-sent-events response over JSON payloads, ending with ``data: [DONE]``."""
    return _ReleasingStream(_sse_events(request, payloads, release), release)
