"""The server's shared state, request admission (the queue limit) and body parsing."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from nibblekv.server.engine_api import ServingEngine, ServingTokenizer
from nibblekv.server.errors import APIError
from nibblekv.server.metrics import ServerMetrics
from nibblekv.server.params import ModelLimits

M = TypeVar("M", bound=BaseModel)

MAX_BODY_BYTES = 32 * 1024 * 1024  # far above any prompt the context can hold
MAX_JSON_DEPTH = 64  # requests are shallow; deeper nesting is hostile


class Admission:
    """Counts engine requests in flight and refuses new ones past ``limit`` (None = unlimited)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_flight = 0

    def reserve(self, count: int) -> Callable[[], None]:
        """Take ``count`` slots or raise a 503; returns an idempotent release function."""
        if self.limit is not None and self.in_flight + count > self.limit:
            raise APIError(
                f"The server is overloaded: {self.in_flight} requests are running or queued "
                f"(limit {self.limit}). Retry later.",
                status=503,
            )
        self.in_flight += count
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= count

        return release

    @contextmanager
    def slots(self, count: int) -> Iterator[None]:
        """:meth:`reserve` as a context manager."""
        release = self.reserve(count)
        try:
            yield
        finally:
            release()


@dataclass
class ServerState:
    """What every handler needs; stored on ``app.state.nibblekv``."""

    engine: ServingEngine
    tokenizer: ServingTokenizer
    model_name: str
    limits: ModelLimits
    sampling_params: Callable[..., Any]  # nibblekv.SamplingParams
    admission: Admission
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    api_key: str | None = None
    log_requests: bool = False  # --log-requests: a line as each engine request starts and as it finishes
    draining: bool = False  # a shutdown signal arrived: /health and new requests get 503
    drain_expired: bool = False  # the drain timeout passed: live requests were aborted
    # engine request id -> the client's id of it (response id or rid), for the requests now generating
    live_requests: dict[str, str] = field(default_factory=dict)
    server_info: dict[str, Any] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)


def get_state(request: Request) -> ServerState:
    """The :class:`ServerState` of the app serving ``request``."""
    state: ServerState = request.app.state.nibblekv
    return state


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of parsed JSON, stopping early past ``limit``."""
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest


async def parse_body(request: Request, model: type[M]) -> M:
    """Read, decode and validate a JSON body; every failure is a 400 with a clear message."""
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(f"request body too large ({len(body)} bytes, limit {MAX_BODY_BYTES})", status=413)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}") from exc
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise APIError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from exc
    except json.JSONDecodeError as exc:
        raise APIError(f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except ValueError as exc:  # e.g. an integer literal with more digits than Python will parse
        raise APIError(f"malformed JSON body: {exc}") from exc
    if not isinstance(data, dict):
        raise APIError(f"the JSON body must be an object, got {type(data).__name__}")
    if _depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise APIError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:  # JSON \uXXXX escapes can smuggle in lone surrogates, which no tokenizer can encode
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"request body contains text that is not valid Unicode: {exc.reason}") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise APIError(*describe_validation(exc)) from exc


def describe_validation(exc: ValidationError, prefix: str = "") -> tuple[str, int, str | None]:
    """(message, status, param) for the first validation error, its field path after ``prefix``."""
    first = exc.errors(include_url=False)[0]
    param = ".".join(([prefix] if prefix else []) + [str(p) for p in first.get("loc", ())])
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")  # a validator's own words
    more = f" (and {exc.error_count() - 1} more errors)" if exc.error_count() > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), 400, param or None
