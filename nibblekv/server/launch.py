"""Starting the server: engine -> :class:`ServerState` -> uvicorn, with a draining SIGTERM.

On SIGTERM / SIGINT the server drains: the listener stays open but ``/health`` and new requests answer 503
(so a router sends work elsewhere), and in-flight requests run on for up to ``--drain-timeout`` seconds.
Those still running then are aborted in the engine, which frees their pages and ends each the way SGLang
clients expect: a stream gets a last chunk with ``finish_reason: "abort"`` and ``data: [DONE]``, a
non-streaming request a 503 error. Only then does uvicorn close the listener; the process exits 0.
A second signal ends the drain at once (the same aborts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from nibblekv.model import bundled_model_path
from nibblekv.model.hub import is_hub_id
from nibblekv.server.app import build_app
from nibblekv.server.metrics import ServerMetrics
from nibblekv.server.params import ModelLimits
from nibblekv.server.state import Admission, ServerState

log = logging.getLogger(__name__)


def served_model_name(model: str | None, override: str | None) -> str:
    """The ``model`` name clients use: ``--served-model-name``, else a Hub id as given (as SGLang and vLLM
    name it), else the file or folder name."""
    if override:
        return override
    if model is None:
        return "SmolLM2-135M-Instruct"
    if is_hub_id(model):
        return model
    return Path(model).stem if Path(model).suffix == ".gguf" else Path(model.rstrip("/")).name or model


def engine_facts(engine: Any) -> dict[str, Any]:
    """The resolved limits of a started :class:`nibblekv.engine.AsyncEngine` (and what it serves)."""
    stats = engine.stats()
    inner = engine.engine
    return {
        "model_path": str(engine.config.model or bundled_model_path()),
        "context_length": int(stats["context_len"]),
        "vocab_size": int(inner.model.config.vocab_size),
        "kv_capacity_tokens": int(inner.pool.capacity_tokens()),
        "max_total_num_tokens": int(stats["max_total_num_tokens"]),
        "max_running_requests": int(stats["max_running_requests"]),
        "kv_cache_dtype": str(stats["kv_cache_dtype"]),
    }


def state_from_engine(engine: Any, args: argparse.Namespace) -> ServerState:
    """Everything the handlers need, read once from a started engine."""
    from nibblekv.engine.sampling_params import SamplingParams

    facts = engine_facts(engine)
    max_running = facts["max_running_requests"]
    limit = None if args.max_queued_requests is None else max_running + args.max_queued_requests
    name = served_model_name(args.model, args.served_model_name)
    metrics = ServerMetrics()
    metrics.attach_engine(engine.stats, facts["max_total_num_tokens"])
    # A prompt must fit the context and the KV pool with room for one new token.
    max_prompt = min(facts["context_length"], facts["kv_capacity_tokens"])
    public_args = {
        k: v for k, v in vars(args).items() if k not in ("func", "api_key") and not k.startswith("_")
    }
    return ServerState(
        engine=engine,
        tokenizer=engine.tokenizer,
        model_name=name,
        limits=ModelLimits(facts["context_length"], facts["vocab_size"], max_prompt),
        sampling_params=SamplingParams,
        admission=Admission(limit),
        metrics=metrics,
        api_key=args.api_key,
        log_requests=args.log_requests,
        model_info={
            "model_path": facts["model_path"],
            "served_model_name": name,
            "is_generation": True,
            "context_length": facts["context_length"],
            "vocab_size": facts["vocab_size"],
            "kv_cache_dtype": facts["kv_cache_dtype"],
        },
        server_info={**public_args, **facts, "max_queued_requests": args.max_queued_requests},
    )


# After the drain timeout: how long aborted requests get to send their last event before uvicorn
# closes the connections anyway (an abort reaches the engine between two steps, milliseconds).
ABORT_GRACE_S: float = 5.0
DRAIN_POLL_S: float = 0.1


class _DrainingServer(uvicorn.Server):
    """uvicorn, with a drain between the shutdown signal and closing the listener (module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float) -> None:
        super().__init__(config)
        self._state = state
        self._drain_timeout = drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._cut_short = False

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's handlers, minus its re-raising of the signal at exit: a drained shutdown exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.started or self._loop is None:  # still starting: nothing to drain
            super().handle_exit(sig, frame)
            return
        if self._state.draining:
            log.warning("second shutdown signal %s: ending the drain now", sig)
            self._cut_short = True
            return
        self._state.draining = True
        log.warning(
            "shutdown signal %s: draining %d in-flight requests (up to %.1f s); /health answers 503",
            sig,
            self._state.admission.in_flight,
            self._drain_timeout,
        )
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Wait for in-flight requests up to the timeout, abort the rest, then let uvicorn close."""
        state = self._state
        deadline = time.monotonic() + self._drain_timeout
        while state.admission.in_flight and not self._cut_short and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        if state.admission.in_flight:
            log.warning("drain timeout: aborting %d requests still in flight", state.admission.in_flight)
            state.drain_expired = True
            aborted: set[str] = set()
            grace_end = time.monotonic() + ABORT_GRACE_S
            # NOTE: re-checked until all end: a request admitted just before the signal may reach the
            # engine after the first sweep.
            while state.admission.in_flight and time.monotonic() < grace_end:
                for request_id in state.live_requests.keys() - aborted:
                    state.engine.abort(request_id)
                    aborted.add(request_id)
                await asyncio.sleep(DRAIN_POLL_S)
        else:
            log.info("drained: no request in flight")
        self.should_exit = True


# NOTE: fresh prompts below and above rope_qk's eager GEMM switch (512 tokens), then the long one again
# plus a few tokens (an extend over its cached prefix where the radix cache is on)
WARMUP_PROMPT_TOKENS: tuple[int, ...] = (16, 640)
WARMUP_NEW_TOKENS = 4


def warm_up(engine: Any, max_prompt: int, vocab_size: int) -> float:
    """Run a few requests through a started :class:`AsyncEngine` before the port opens, as SGLang's server
    warm-up does: Triton compiles each kernel build on first use (seconds each), so without it the first
    real requests pay them. Flushes the prefix cache afterwards (an idle server holds no pages). Returns the
    seconds it took."""
    from nibblekv.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=WARMUP_NEW_TOKENS, ignore_eos=True)
    cap = max(1, max_prompt - WARMUP_NEW_TOKENS)
    ids = [10 + i % max(1, vocab_size - 10) for i in range(cap)]
    lens = sorted({min(n, cap) for n in WARMUP_PROMPT_TOKENS})
    prompts = [ids[:n] for n in lens] + [ids[: min(lens[-1] + 24, cap)]]

    async def run() -> None:
        for prompt in prompts:
            async for _ in engine.generate(prompt, params):
                pass
        await engine.flush_cache()

    t0 = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - t0


def export_tokenizer(tokenizer: Any, folder: str | Path) -> Path:
    """Save the served tokenizer as an HF tokenizer folder (``tokenizer.json``, ``tokenizer_config.json``)
    that ``transformers.AutoTokenizer.from_pretrained(folder)`` loads offline: lm-eval's ``tokenizer=``
    for a model with no Hub tokenizer at hand (a GGUF file). Returns the folder."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None:
        raise ValueError(
            f"--export-tokenizer: the served model has no HF tokenizer to export ({type(tokenizer).__name__})"
        )
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    return out


def serve(engine: Any, args: argparse.Namespace) -> int:
    """Serve until a shutdown signal; returns the exit code."""
    if getattr(args, "export_tokenizer", None):
        folder = export_tokenizer(engine.tokenizer, args.export_tokenizer)
        log.info("tokenizer written to %s (lm-eval: tokenizer=%s)", folder, folder)
    if not args.skip_server_warmup:
        facts = engine_facts(engine)
        secs = warm_up(engine, min(facts["context_length"], facts["kv_capacity_tokens"]), facts["vocab_size"])
        log.info("warm-up: %d requests in %.2f s", len(WARMUP_PROMPT_TOKENS) + 1, secs)
    state = state_from_engine(engine, args)
    app = build_app(state)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=ABORT_GRACE_S,  # the drain itself runs before uvicorn's shutdown
        timeout_keep_alive=5,
        access_log=args.log_level == "debug",
    )
    server = _DrainingServer(config, state, args.drain_timeout)
    log.info("serving %s on http://%s:%d", state.model_name, args.host, args.port)
    log.info("The server is fired up and ready to roll!")
    try:
        server.run()  # returns once drained (or at the drain timeout)
    finally:
        state.draining = True
        _log_engine_at_exit(engine)
        engine.shutdown()
    return 0 if server.started else 1


def _log_engine_at_exit(engine: Any) -> None:
    """What the engine still holds as it stops: after a drain, nothing runs and (without a prefix
    cache) no KV page is in use."""
    stats = engine.stats()
    log.info(
        "engine at exit: %d running, %d queued, %d KV tokens in use",
        stats["running"],
        stats["queued"],
        stats["used_tokens"],
    )
