"""Running engine requests for one HTTP request: several generations at once, abort on disconnect.

Every generation runs inside :func:`generation_stream`, whose ``finally`` aborts the engine request
unless it finished, so a cancelled handler (client gone, server draining, error elsewhere) frees its
pages at once instead of decoding to ``max_tokens`` for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request

from nibblekv.server.engine_api import Delta, DeltaReader, ServingEngine
from nibblekv.server.errors import APIError, ClientDisconnected

T = TypeVar("T")


@dataclass(frozen=True)
class GenerationJob:
    """One engine request: which choice it fills, its prompt ids and sampling parameters, and the id the
    client knows it by (its response's id, or the native route's ``rid``: what ``/abort_request`` takes)."""

    index: int
    prompt_ids: list[int]
    params: Any
    client_id: str = ""


async def generation_stream(
    engine: ServingEngine, job: GenerationJob, live: dict[str, str] | None = None
) -> AsyncIterator[Delta]:
    """Deltas of one engine request; aborts it if the consumer stops early. ``live`` maps its engine request
    id to ``job.client_id`` while it runs (a draining server aborts those at the drain timeout, and
    ``/abort_request`` those of a client id)."""
    request_id = uuid.uuid4().hex
    finished = False
    reader = DeltaReader(job.prompt_ids)
    if not engine.is_healthy():
        raise APIError("the engine is not running", status=503)
    live = {} if live is None else live
    live[request_id] = job.client_id
    try:
        async for out in engine.generate(job.prompt_ids, job.params, request_id=request_id):
            delta = reader.read(out)
            finished = delta.finished
            yield delta
            if finished:
                return
    finally:
        live.pop(request_id, None)
        if not finished:
            engine.abort(request_id)


async def merged_streams(
    engine: ServingEngine, jobs: Sequence[GenerationJob], live: dict[str, str] | None = None
) -> AsyncIterator[tuple[int, Delta]]:
    """Deltas of several engine requests as they arrive, tagged with their job index (``live``: see
    :func:`generation_stream`)."""
    if len(jobs) == 1:  # the common case needs no tasks
        async with contextlib.aclosing(generation_stream(engine, jobs[0], live)) as stream:
            async for delta in stream:
                yield jobs[0].index, delta
        return
    queue: asyncio.Queue[tuple[int, Delta] | BaseException | None] = asyncio.Queue()

    async def pump(job: GenerationJob) -> None:
        try:
            async with contextlib.aclosing(generation_stream(engine, job, live)) as stream:
                async for delta in stream:
                    await queue.put((job.index, delta))
        except Exception as exc:  # noqa: BLE001 -- handed to the consumer, which re-raises it
            await queue.put(exc)
        await queue.put(None)

    tasks = [asyncio.create_task(pump(job)) for job in jobs]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_for_disconnect(request: Request) -> None:
    """Return once the client has disconnected (the request body must already be read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it and raise :class:`ClientDisconnected` if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientDisconnected()
    finally:
        for pending in (task, watcher):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending


async def _cancel(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has unwound (its ``finally`` blocks ran)."""
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
        await task


async def stop_on_disconnect(request: Request, source: AsyncIterator[T]) -> AsyncIterator[T]:
    """Items of ``source`` until it ends or the client disconnects (then ``source`` is closed).

    Starlette also cancels a streaming response on disconnect with some ASGI servers; watching
    here as well keeps a request that is still queued (no token to send yet) from living on.
    Whichever way this ends (done, disconnect, cancellation), the pending ``anext`` is cancelled
    first, so closing ``source`` runs its ``finally`` (the engine abort) right away.
    """
    watcher = asyncio.create_task(wait_for_disconnect(request))
    step: asyncio.Future[T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if step not in done:
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if step is not None:
            await _cancel(step)
        await _cancel(watcher)
        aclose = getattr(source, "aclose", None)
        # NOTE: under an anyio cancel scope every await here is cancelled again; the step's own
        # cancellation has already closed ``source`` (and aborted its engine requests) in that case.
        if aclose is not None:
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):
                await aclose()
