"""The `alloctrace` command: one subcommand per module in alloctrace/commands/.

Each module defines `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. Errors a user can cause are UserError: one line on stderr,
no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import __version__, commands
from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="alloctrace",
        description="Record, replay, diff and explain memory planners: ggml's graph allocator and PyTorch's CUDA "
                    "caching allocator.",
    )
    parser.add_argument("--version", action="version", version=f"alloctrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{mod.name}").register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"alloctrace: error: {safe(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("alloctrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
