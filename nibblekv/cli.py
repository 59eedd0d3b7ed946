"""`nibblekv` command line: one subcommand per module, each importing its heavy deps lazily.

A subcommand module exposes ``register(subparsers) -> None``, which adds its parser and sets
``func=run`` where ``run(args) -> int`` returns the exit code. Every parser prints its help with
:class:`~nibblekv.cli_style.HelpFormatter` (defaults shown, examples kept as written) and reports bad
input in one line (:class:`~nibblekv.cli_style.Parser`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from nibblekv import __version__
from nibblekv.cli_style import HelpFormatter, Parser, use_help_formatter

__all__ = ["HelpFormatter", "Parser", "build_parser", "main", "use_help_formatter"]

DESCRIPTION = (
    "nibblekv: an LLM serving engine whose paged KV cache is stored in 4 bits (NVFP4), fast on Hopper "
    "GPUs. Run a model offline (generate), serve it over an OpenAI-compatible API (serve), size the KV "
    "cache for a GPU (plan), load-test a server (bench serve) and measure KV accuracy (eval). Without "
    "--model, generate and serve run the bundled SmolLM2-135M-Instruct, on CPU or GPU."
)
EPILOG = """examples:
  nibblekv generate "The capital of France is" --max-new-tokens 16
  nibblekv serve --model /models/Llama-3.1-8B-Instruct --kv-cache-dtype nvfp4 --port 30000
  nibblekv bench serve --base-url http://127.0.0.1:30000 --num-prompts 100
  nibblekv plan --model llama-3.1-8b --gpu H200 --context 128k

Run 'nibblekv COMMAND --help' for the flags of a command."""


# subcommand -> module that registers it (imported only when the CLI starts), in the order help lists them
SUBCOMMANDS: dict[str, str] = {
    "generate": "nibblekv.engine.cli",
    "serve": "nibblekv.server.cli",
    "bench": "nibblekv.bench.cli",
    "plan": "nibblekv.planner.cli",
    "eval": "nibblekv.eval.cli",
    "calibrate": "nibblekv.eval.calibrate_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="nibblekv", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"nibblekv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("nibblekv"):
                continue  # a subcommand whose module is not built yet
            raise
        mod.register(sub)
    use_help_formatter(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
