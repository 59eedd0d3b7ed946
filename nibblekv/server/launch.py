"""Starting the server: engine -> :class:`ServerState` -> uvicorn, with a draining SIGTERM.

On SIGTERM / SIGINT uvicorn stops accepting connections and waits for in-flight requests up to
``--drain-timeout`` seconds; ``/health`` answers 503 meanwhile so a router stops sending work. Requests
still running at the timeout are cancelled (their engine requests aborted), then the engine stops.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import uvicorn

from nibblekv.server.app import build_app
from nibblekv.server.metrics import ServerMetrics
from nibblekv.server.params import ModelLimits
from nibblekv.server.state import Admission, ServerState

log = logging.getLogger(__name__)
DEFAULT_MAX_RUNNING = 256  # admission bound when the engine does not say


def served_model_name(model: str | None, override: str | None) -> str:
    """The ``model`` name clients use: ``--served-model-name``, else the file or folder name."""
    if override:
        return override
    if model is None:
        return "SmolLM2-135M-Instruct"
    return Path(model).stem if Path(model).suffix == ".gguf" else Path(model.rstrip("/")).name or model


def state_from_engine(engine: Any, args: argparse.Namespace) -> ServerState:
    """Everything the handlers need, read once from a started engine."""
    from nibblekv.engine.sampling_params import SamplingParams

    info = engine.info()  # resolved limits: context length, pool size, batch size, model path
    max_running = int(info.get("max_running_requests") or DEFAULT_MAX_RUNNING)
    limit = None if args.max_queued_requests is None else max_running + args.max_queued_requests
    name = served_model_name(args.model, args.served_model_name)
    metrics = ServerMetrics()
    metrics.attach_engine(engine.stats, int(info.get("max_total_tokens") or 0))
    return ServerState(
        engine=engine,
        tokenizer=engine.tokenizer,
        model_name=name,
        limits=ModelLimits(int(info["context_length"]), int(engine.tokenizer.vocab_size)),
        sampling_params=SamplingParams,
        admission=Admission(limit),
        metrics=metrics,
        api_key=args.api_key,
        model_info={"model_path": str(info.get("model_path") or name), "served_model_name": name,
                    "is_generation": True, "context_length": int(info["context_length"]),
                    "vocab_size": int(engine.tokenizer.vocab_size), "kv_cache_dtype": info.get("kv_cache_dtype")},
        server_info={**{k: v for k, v in vars(args).items() if k not in ("func", "api_key") and not k.startswith("_")},
                     **info},
    )


class _DrainingServer(uvicorn.Server):
    """Marks the app as draining (``/health`` -> 503) as soon as a shutdown signal arrives."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self._state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self._state.draining:
            log.info("shutdown signal %s: draining %d in-flight requests", sig, self._state.admission.in_flight)
        self._state.draining = True
        super().handle_exit(sig, frame)


def serve(engine: Any, args: argparse.Namespace) -> int:
    """Serve until a shutdown signal; returns the exit code."""
    state = state_from_engine(engine, args)
    app = build_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.drain_timeout, timeout_keep_alive=5,
                            access_log=args.log_level == "debug")
    server = _DrainingServer(config, state)
    log.info("serving %s on http://%s:%d", state.model_name, args.host, args.port)
    try:
        server.run()  # returns once drained (or at the drain timeout)
    finally:
        state.draining = True
        engine.shutdown()
    return 0 if server.started else 1
