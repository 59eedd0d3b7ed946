"""How every ``nibblekv`` parser prints help and reports bad input (argparse only, no nibblekv imports, so
any command-line module may use it, the torch-free ``bench`` client included)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn, TypeVar

_Number = TypeVar("_Number", int, float)


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


def add_command(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    run: Callable[[argparse.Namespace], int],
    help: str,
    description: str | None = None,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """Add the subcommand ``name``, run as ``run(args)``; ``args._parser`` is its parser (for one-line
    ``parser.error`` reports from ``run``)."""
    parser = subparsers.add_parser(name, help=help, description=description, epilog=epilog)
    parser.set_defaults(func=run, _parser=parser)
    return parser


def add_switch(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, default: bool | None, help: str
) -> None:
    """``--flag`` / ``--no-flag`` (``default=None``: the engine picks, per KV dtype and model)."""
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help)


def _bounded(value: _Number, ok: bool, want: str) -> _Number:
    """``value`` where it is ``ok``, else argparse's one-line "must be ``want``, got ``value``"."""
    if not ok:
        raise argparse.ArgumentTypeError(f"must be {want}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1."""
    value = int(text)
    return _bounded(value, value >= 1, ">= 1")


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    value = int(text)
    return _bounded(value, value >= 0, ">= 0")


def positive_float(text: str) -> float:
    """An argparse type: a float > 0."""
    value = float(text)
    return _bounded(value, value > 0, "> 0")


def open_fraction(text: str) -> float:
    """An argparse type: a float in (0, 1)."""
    value = float(text)
    return _bounded(value, 0.0 < value < 1.0, "in (0, 1)")


def closed_fraction(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    value = float(text)
    return _bounded(value, 0.0 <= value <= 1.0, "in [0, 1]")
