"""`nibblekv` command line: one subcommand per module, each importing its heavy deps lazily.

A subcommand module exposes ``register(subparsers) -> None``, which adds its parser and sets
``func=run`` where ``run(args) -> int`` returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that registers it (imported only when the CLI starts)
SUBCOMMANDS: dict[str, str] = {
    "plan": "nibblekv.planner.cli",
    "generate": "nibblekv.engine.cli",
    "serve": "nibblekv.server.cli",
    "bench": "nibblekv.bench.cli",
    "eval": "nibblekv.eval.cli",
    "calibrate": "nibblekv.eval.calibrate_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nibblekv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("nibblekv"):
                continue  # a subcommand whose module is not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
