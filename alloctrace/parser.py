"""The `alloctrace` command's parser: argparse, with one subparser per module of alloctrace/commands/ (each
defines `register(subparsers)`, which adds its parser and sets `func(args) -> int`). Apart from cli.py so
that a command line read without it (`alloctrace record`'s usual one, commands/record.py `args_from`) never
imports argparse."""
from __future__ import annotations

import argparse
import importlib
import os

from . import __version__, commands


class HelpFormatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal as usual, but keeps an "Examples:" epilog line by line."""

    def _fill_text(self, text, width, indent):
        if text.startswith("Examples:"):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


VERBOSE_HELP = ("say on stderr, at the end, what ran: the store backend and path (no password), the budgets, "
                "which reader (compiled or pure Python), which generation profile, and each stage's time")


class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: the formatter above unless the command asks for another."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
        self.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)


def command_modules() -> dict[str, str]:
    """Command name -> its module's name (`import_` is `import`), without importing any of them: the modules
    of alloctrace/commands/ (listed, not through pkgutil, whose import costs a short command 5 ms)."""
    names = (n[:-3] for folder in commands.__path__ for n in os.listdir(folder) if n.endswith(".py"))
    return {m.rstrip("_"): m for m in names if not m.startswith("_")}


def named_command(argv: list[str] | None) -> str | None:
    """The command `argv` names, if its first word is one: then only that module needs importing (every
    command importing every other's dependencies costs a short command most of its time)."""
    if not argv:
        return None
    first = argv[0]
    return first if first in command_modules() else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `argv` naming a command, a parser that knows only that command."""
    parser = argparse.ArgumentParser(
        prog="alloctrace",
        description="Record, replay, diff and explain memory planners: ggml's graph allocator and PyTorch's CUDA "
                    "caching allocator.",
    )
    parser.add_argument("--version", action="version", version=f"alloctrace {__version__}")
    parser.add_argument("-v", "--verbose", dest="global_verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    mods = command_modules()
    only = named_command(argv)
    for name in sorted(mods) if only is None else [only]:
        importlib.import_module(f"{commands.__name__}.{mods[name]}").register(sub)
    return parser
