"""The engine for servers: its loop runs in a background thread; callers stream outputs with asyncio.

All engine state is touched only by the loop thread; callers talk to it through a command queue
(add / abort), and outputs come back through each request's ``asyncio.Queue`` on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator
from typing import Any

from nibblekv.config import EngineConfig
from nibblekv.engine.engine import Engine, Prompt
from nibblekv.engine.request import Request, RequestOutput
from nibblekv.engine.sampling_params import SamplingParams

logger = logging.getLogger("nibblekv")

_IDLE_WAIT_S: float = 0.05


class AsyncEngine:
    """``async for out in engine.generate(prompt, params): ...`` with the engine loop in a thread."""

    def __init__(self, config: EngineConfig | None = None, **overrides: Any) -> None:
        self.engine = Engine(config, **overrides)
        self.engine.stream = True
        self.config = self.engine.config
        self.tokenizer = self.engine.tokenizer
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nibblekv-engine", daemon=True)
        self._thread.start()

    # ---- caller side ----------------------------------------------------------------------------
    async def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs (each with the new ``text_delta``); the last has ``finished``.

        Raises ``ValueError`` for an invalid prompt before anything is queued. Leaving the loop early
        (e.g. a client disconnect) aborts the request and frees its pages.
        """
        if not self.is_healthy():
            raise RuntimeError("the engine loop is not running") from self._error
        loop = asyncio.get_running_loop()
        sink: asyncio.Queue = asyncio.Queue()
        with self._lock:
            req = self.engine.make_request(prompt, params, request_id)
            if req.request_id in self._sinks:
                raise ValueError(f"request id {req.request_id!r} is already in use")
            self._sinks[req.request_id] = (loop, sink)
        self._send("add", req)
        finished = False
        try:
            while not finished:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise RuntimeError("the engine loop failed") from item  # noqa: TRY004
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(req.request_id)
            with self._lock:
                self._sinks.pop(req.request_id, None)

    def abort(self, request_id: str) -> None:
        """Abort a request; its pages are freed before the engine's next step."""
        self._send("abort", request_id)

    async def flush_cache(self) -> bool:
        """``Engine.flush_cache`` on the loop thread, between steps (False while requests run or wait)."""
        if not self.is_healthy():
            raise RuntimeError("the engine loop is not running") from self._error
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._send("flush", done)
        return await asyncio.wrap_future(done)

    def stats(self) -> dict[str, Any]:
        """Gauges and totals for metrics (read without locking: each is one attribute read)."""
        e = self.engine
        s = e.stats
        return {
            "running": len(e.scheduler.running),
            "queued": len(e.scheduler.waiting),
            "token_usage": e.pool.token_usage(),
            "used_tokens": e.pool.used_tokens(),
            "max_total_num_tokens": e.max_total_num_tokens,
            "max_running_requests": e.max_running,
            "context_len": e.context_len,
            "kv_cache_dtype": e.pool.spec.kv_dtype.value,
            "prompt_tokens_total": s.prompt_tokens,
            "generation_tokens_total": s.generation_tokens,
            "finished_requests_total": s.finished_requests,
            "aborted_requests_total": s.aborted_requests,
            "preemptions_total": e.scheduler.num_preemptions,
            **e.cache_stats(),
        }

    def is_healthy(self) -> bool:
        return self._thread.is_alive() and self._error is None and not self._stop

    def shutdown(self) -> None:
        """Stop the loop thread (requests still running are dropped)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)
        self.engine.shutdown()  # tensor-parallel workers, if any

    def _send(self, kind: str, payload: Any) -> None:
        self._commands.put((kind, payload))
        self._wake.set()

    # ---- loop thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._wake.wait(_IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
        except BaseException as exc:  # every waiting caller must hear about it
            logger.exception("engine loop failed")
            self._error = exc
            with self._lock:
                for rid in list(self._sinks):
                    self._deliver(rid, exc)

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                req: Request = payload
                self.engine.enqueue(req)
            elif kind == "abort":
                out = self.engine.abort(payload)
                if out is not None:
                    self._deliver(out.request_id, out)
            elif kind == "flush":
                done: concurrent.futures.Future[bool] = payload
                try:
                    done.set_result(self.engine.flush_cache())
                except Exception as exc:  # noqa: BLE001 - the caller hears it; the loop goes on
                    done.set_exception(exc)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        target = self._sinks.get(request_id)
        if target is not None:
            loop, sink = target
            loop.call_soon_threadsafe(sink.put_nowait, item)
