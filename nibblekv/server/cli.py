"""``nibblekv serve``: the OpenAI-compatible HTTP server (SGLang-style flags).

Imports FastAPI, uvicorn and the engine only when the command runs, so ``nibblekv --help`` works on
machines without the ``server`` extra.
"""

from __future__ import annotations

import argparse
import logging

from nibblekv.cli_style import add_command, non_negative_int

HELP = "start the OpenAI-compatible HTTP server"
DESCRIPTION = (
    "Start an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /v1/models; "
    "/health, /metrics) with SGLang-style flags. The model defaults to the bundled SmolLM2-135M-Instruct; "
    "the KV cache dtype defaults to the model's dtype (--kv-cache-dtype nvfp4 for the 4-bit cache)."
)
EPILOG = """examples:
  nibblekv serve --kv-cache-dtype nvfp4
  nibblekv serve --model /models/Llama-3.1-8B-Instruct --kv-cache-dtype nvfp4 --host 0.0.0.0 --port 30000
  curl http://127.0.0.1:30000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "default", "messages": [{"role": "user", "content": "Hello"}]}'"""


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be in 1..65535, got {value}")
    return value


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The HTTP flags (engine flags come from :func:`nibblekv.config.add_engine_args`)."""
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    g.add_argument("--port", type=_port, default=30000, help="port to listen on")
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/*, /generate, /tokenize and /detokenize",
    )
    g.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: the --model file or folder name)",
    )
    g.add_argument(
        "--max-queued-requests",
        type=non_negative_int,
        default=None,
        help="requests waiting beyond --max-running-requests before new ones get 503 (default: no limit)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds SIGTERM waits for in-flight requests before aborting them (streams end with "
        'finish_reason "abort", others get 503)',
    )
    g.add_argument(
        "--export-tokenizer",
        default=None,
        metavar="DIR",
        help="write the served model's tokenizer to DIR as an HF tokenizer folder at start-up, for "
        "clients that tokenize themselves (lm-eval's tokenizer=DIR), no Hub download needed",
    )
    g.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level"
    )
    g.add_argument(
        "--log-requests",
        action="store_true",
        help="log each request as it arrives (prompt tokens, sampling parameters) and as it ends (finish "
        "reason, tokens, latency); no prompt or output text",
    )
    g.add_argument(
        "--skip-server-warmup",
        action="store_true",
        help="open the port without first running a few warm-up requests (which compile the kernels)",
    )
    g.add_argument(
        "--enable-metrics",
        action="store_true",
        help="accepted for SGLang command lines: /metrics is always served",
    )


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``serve``."""
    from nibblekv.config import add_engine_args

    parser = add_command(subparsers, "serve", run, HELP, DESCRIPTION, EPILOG)
    add_engine_args(parser)
    add_server_args(parser)


def run(args: argparse.Namespace) -> int:
    """Start the engine and serve until SIGTERM / SIGINT."""
    from nibblekv.engine import AsyncEngine
    from nibblekv.engine.cli import config_from_args_or_exit
    from nibblekv.engine.gc_heap import frozen_heap
    from nibblekv.model.source import model_source_error
    from nibblekv.server.launch import serve

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args_or_exit(args._parser, args)
    problem = model_source_error(config.model, config.load_format, bool(config.json_model_override_args))
    if problem:
        args._parser.error(problem)  # exit 2 before the engine loads and before the port opens
    engine = AsyncEngine(config)
    with frozen_heap():  # full GC passes then skip the start-up heap (engine/gc_heap.py)
        return serve(engine, args)
