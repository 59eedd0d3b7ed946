"""The FastAPI application: OpenAI routes, health, metrics, model/server info, cache flush, API-key check."""

from __future__ import annotations

import asyncio
import hmac
import uuid

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from nibblekv import __version__
from nibblekv.server.chat import create_chat_completion
from nibblekv.server.completions import create_completion
from nibblekv.server.errors import error_response, install_error_handlers
from nibblekv.server.native import abort_request, generate
from nibblekv.server.protocol import ModelCard, ModelList, dump
from nibblekv.server.state import ServerState, get_state
from nibblekv.server.tokens import detokenize, tokenize

# Paths that need the API key (as in vLLM): the OpenAI API, SGLang's /generate and vLLM's (de)tokenize.
# Health, metrics and info stay open so load balancers and routers (sglang-router polls them) work without
# credentials.
_PROTECTED_PREFIX = "/v1/"
_PROTECTED_PATHS = frozenset({"/generate", "/abort_request", "/tokenize", "/detokenize"})
HEALTH_GENERATE_TIMEOUT_S: float = 20.0  # SGLang's


class APIKeyMiddleware:
    """Pure ASGI check of ``Authorization: Bearer <key>`` (or ``x-api-key``) on the OpenAI routes.

    NOTE: pure ASGI rather than ``@app.middleware``: Starlette's BaseHTTPMiddleware wraps streaming
    bodies and ``receive``, which gets in the way of disconnect detection.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        protected = scope["type"] == "http" and (
            path.startswith(_PROTECTED_PREFIX) or path in _PROTECTED_PATHS
        )
        if protected and not self._authorized(Headers(scope=scope)):
            await error_response("Incorrect API key provided.", 401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            token = headers.get("x-api-key", "")
        return hmac.compare_digest(token.strip().encode(), self.api_key.encode())


async def _health(request: Request) -> Response:
    """200 while the engine loop is alive and the server is not draining, else 503."""
    state = get_state(request)
    if state.draining:
        return error_response("the server is shutting down", 503)
    if not state.engine.is_healthy():
        return error_response("the engine is not running", 503)
    return Response(status_code=200)


async def _health_generate(request: Request) -> Response:
    """SGLang's ``/health_generate``: 200 once the engine has generated a token for ``input_ids=[0]`` (a
    real forward through the running engine), 503 if it is unhealthy or takes over
    :data:`HEALTH_GENERATE_TIMEOUT_S`."""
    health = await _health(request)
    if health.status_code != 200:
        return health
    state = get_state(request)
    params = state.sampling_params(max_new_tokens=1, temperature=0.0, ignore_eos=True)

    async def one_token() -> None:
        async for _ in state.engine.generate([0], params, request_id=f"health-generate-{uuid.uuid4().hex}"):
            pass

    try:
        await asyncio.wait_for(one_token(), HEALTH_GENERATE_TIMEOUT_S)
    except TimeoutError:
        return error_response(f"the engine generated nothing within {HEALTH_GENERATE_TIMEOUT_S:.0f} s", 503)
    except RuntimeError as exc:  # the engine loop failed meanwhile
        return error_response(f"the engine failed: {exc}", 503)
    return Response(status_code=200)


async def _flush_cache(request: Request) -> Response:
    """SGLang's ``/flush_cache``: 200 once the prefix cache is dropped, 400 while requests run or wait."""
    if not await get_state(request).engine.flush_cache():
        return error_response("Cache not flushed because there are running or waiting requests", 400)
    return Response("Cache flushed.\n", status_code=200, media_type="text/plain")


async def _metrics(request: Request) -> Response:
    body = get_state(request).metrics.render()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def _models(request: Request) -> JSONResponse:
    state = get_state(request)
    card = ModelCard(
        id=state.model_name,
        root=state.model_info.get("model_path"),
        max_model_len=state.limits.context_length,
    )
    return JSONResponse(dump(ModelList(data=[card])))


async def _version(_: Request) -> JSONResponse:
    """vLLM's ``/version``."""
    return JSONResponse({"version": __version__})


async def _model_info(request: Request) -> JSONResponse:
    return JSONResponse(get_state(request).model_info)


async def _server_info(request: Request) -> JSONResponse:
    state = get_state(request)
    stats = state.engine.stats()
    live = (
        stats if isinstance(stats, dict) else {k: v for k, v in vars(stats).items() if not k.startswith("_")}
    )
    return JSONResponse(
        {
            **state.server_info,
            "version": __version__,
            "engine_stats": live,
            "in_flight_requests": state.admission.in_flight,
        }
    )


def build_app(state: ServerState) -> FastAPI:
    """An app serving ``state.engine``."""
    app = FastAPI(title="nibblekv", version=__version__, docs_url=None, redoc_url=None)
    app.state.nibblekv = state
    install_error_handlers(app)

    if state.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=state.api_key)

    app.add_api_route("/v1/completions", create_completion, methods=["POST"])
    app.add_api_route("/v1/chat/completions", create_chat_completion, methods=["POST"])
    app.add_api_route("/v1/models", _models, methods=["GET"])
    app.add_api_route("/generate", generate, methods=["POST"])
    app.add_api_route("/abort_request", abort_request, methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    app.add_api_route("/version", _version, methods=["GET"])
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/metrics", _metrics, methods=["GET"])
    app.add_api_route("/health_generate", _health_generate, methods=["GET"])
    app.add_api_route("/flush_cache", _flush_cache, methods=["GET", "POST"])
    # SGLang names, plus the unprefixed ones newer sglang-router versions poll.
    for path in ("/get_model_info", "/model_info"):
        app.add_api_route(path, _model_info, methods=["GET"])
    for path in ("/get_server_info", "/server_info"):
        app.add_api_route(path, _server_info, methods=["GET"])
    return app
