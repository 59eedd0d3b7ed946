"""`nibblekv` command line: one subcommand per module, each importing its heavy deps lazily.

A subcommand module exposes ``register(subparsers) -> None``, which adds its parser and sets
``func=run`` where ``run(args) -> int`` returns the exit code. Every parser prints its help with
:class:`HelpFormatter` (defaults shown, examples kept as written) and reports bad input in one line
(:class:`Parser`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from nibblekv import __version__

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


class Parser(argparse.ArgumentParser):
    """Errors take one line, ``nibblekv <command>: error: ...``, exit 2: argparse's format without the
    usage block before it (generate's and serve's flags fill 40 lines; --help prints them). Subcommand
    parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpFormatter(argparse.HelpFormatter):
    """Prose paragraphs are wrapped; paragraphs with indented lines (examples) are kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        paragraphs = text.split("\n\n")
        return "\n\n".join(
            p if any(line.startswith(" ") for line in p.splitlines()) else fill(p, width, indent)
            for p in paragraphs
        )


def _with_default(action: argparse.Action) -> str | None:
    """``action``'s help ending with its default, unless that says nothing (None, False, an empty list)
    or the help already states it."""
    text, default = action.help, action.default
    if (
        text == argparse.SUPPRESS
        or not action.option_strings
        or default is None
        or default is False
        or default is argparse.SUPPRESS
        or default in ([], ())
        or "default" in (text or "").lower()
    ):
        return text
    shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
    if text and f"{shown}:" in text:
        return text  # the help explains the default value already, e.g. "auto: ..."
    return f"{text or ''} (default: {shown.replace('%', '%%')})".lstrip()


def use_help_formatter(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` and every subcommand parser below it :class:`HelpFormatter` and options' help
    that states their defaults (once per parser: the help texts are rewritten in place)."""
    parser.formatter_class = HelpFormatter
    for action in parser._actions:
        action.help = _with_default(action)
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                use_help_formatter(child)


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
