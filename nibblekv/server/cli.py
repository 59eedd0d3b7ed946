"""``nibblekv serve``: the OpenAI-compatible HTTP server (SGLang-style flags).

Imports FastAPI, uvicorn and the engine only when the command runs, so ``nibblekv --help`` works on
machines without the ``server`` extra.
"""

from __future__ import annotations

import argparse
import logging


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"must be in 1..65535, got {value}")
    return value


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The HTTP flags (engine flags come from :func:`nibblekv.config.add_engine_args`)."""
    from nibblekv.config import non_negative_int

    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=_port, default=30000)
    g.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/*")
    g.add_argument("--served-model-name", default=None, help="the `model` name clients use")
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
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g.add_argument(
        "--skip-server-warmup",
        action="store_true",
        help="open the port without first running a few warm-up requests (which compile the kernels)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``serve``."""
    from nibblekv.config import add_engine_args

    parser = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    add_engine_args(parser)
    add_server_args(parser)
    parser.set_defaults(func=run, _parser=parser)


def run(args: argparse.Namespace) -> int:
    """Start the engine and serve until SIGTERM / SIGINT."""
    from nibblekv.config import config_from_args_or_exit
    from nibblekv.engine import AsyncEngine
    from nibblekv.engine.gc_heap import frozen_heap
    from nibblekv.server.launch import serve

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args_or_exit(args._parser, args)
    engine = AsyncEngine(config)
    with frozen_heap():  # full GC passes then skip the start-up heap (engine/gc_heap.py)
        return serve(engine, args)
