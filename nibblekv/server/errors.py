"""OpenAI-style errors: one exception type and the FastAPI handlers that render every failure.

Every error body is ``{"error": {"message", "type", "param", "code"}}``. Validation failures,
malformed JSON and bodies that are not UTF-8 all become 400s; nothing a client sends should reach the
generic 500 handler.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from nibblekv.server.protocol import ErrorInfo, ErrorResponse, dump

log = logging.getLogger(__name__)

# HTTP status -> OpenAI error ``type``.
_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error to return to the client with an HTTP status and an optional offending ``param``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


class ClientDisconnected(Exception):
    """The HTTP client went away before the response was complete (answered with 499, unread)."""


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """The JSON body for an error."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return dump(ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=status)))


def error_response(message: str, status: int, param: str | None = None) -> JSONResponse:
    """An error as a ``JSONResponse``."""
    return JSONResponse(error_body(message, status, param), status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A one-line message (and the first offending field) from pydantic's error list."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', 'could not parse')}", None
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")  # a validator's own words
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return (f"{param}: {msg}{more}" if param else f"{msg}{more}"), param


async def _on_api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.message, exc.status, exc.param)


async def _on_disconnect(_: Request, exc: Exception) -> Response:
    return Response(status_code=499)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = _validation_message(exc)
    return error_response(message, 400, param)


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    phrase = HTTPStatus(exc.status_code).phrase if exc.status_code in HTTPStatus._value2member_map_ else ""
    return error_response(str(exc.detail or phrase), exc.status_code)


async def _on_value_error(_: Request, exc: Exception) -> JSONResponse:
    # Engine-side validation (SamplingParams, tokenizer) raises ValueError for bad client input.
    return error_response(str(exc), 400)


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(f"internal server error: {type(exc).__name__}", 500)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type the server can raise to an OpenAI-style body."""
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(ClientDisconnected, _on_disconnect)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(ValueError, _on_value_error)
    app.add_exception_handler(UnicodeDecodeError, _on_value_error)
    app.add_exception_handler(json.JSONDecodeError, _on_value_error)
    app.add_exception_handler(Exception, _on_unexpected)
