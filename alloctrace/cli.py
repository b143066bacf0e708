"""The `alloctrace` command: one subcommand per module in alloctrace/commands/.

Each module defines `register(subparsers)`, which adds its parser and sets
`func(args) -> int`. Errors a user can cause are UserError: one line on stderr,
no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__, commands
from alloctrace.traces.errors import UserError
from alloctrace.traces.util import verbose
from alloctrace.traces.util.textsafe import safe


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


def join_dashed_values(argv: list[str]) -> list[str]:
    """`--vary -c=512` as `--vary=-c=512`: argparse takes a value that starts with a dash for an option."""
    out: list[str] = []
    words = iter(argv)
    for w in words:
        if w == "--":
            out += [w, *words]
            break
        out.append(w)
        if w == "--vary":
            nxt = next(words, None)
            if nxt is not None and nxt.startswith("-") and "=" in nxt:
                out[-1] = f"--vary={nxt}"
            elif nxt is not None:
                out.append(nxt)
    return out


def main(argv=None) -> int:
    argv = join_dashed_values(sys.argv[1:] if argv is None else list(argv))
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    args.verbose = bool(getattr(args, "verbose", False) or args.global_verbose)
    verbose.reset()
    try:
        with verbose.stage(args.command):
            return int(args.func(args) or 0)
    except UserError as e:
        print(f"alloctrace: error: {safe(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("alloctrace: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        if args.verbose:
            for line in verbose.lines():
                print(f"alloctrace: {safe(line)}", file=sys.stderr)


def console() -> None:
    """The `alloctrace` command itself (the console script and `python -m alloctrace`): `main()`, then the
    end of the process without the interpreter's teardown, which costs a short command a tenth of its time
    (freeing every module, and closing a SQLite store checkpoints its WAL into the database: two fsyncs;
    the next opener reads a WAL left behind, as after any crash). Output is flushed and atexit handlers run
    first, which is all the ordinary exit does for us; with another thread still running (a server's), or
    an exception leaving main (--help, a usage error, a traceback), the process exits the ordinary way."""
    import atexit

    rc = main()
    flush_stdio()
    atexit._run_exitfuncs()  # what the ordinary exit would run (a PostgreSQL store closes its pool), now
    threading = sys.modules.get("threading")  # not imported: no thread was started
    if threading is not None and threading.active_count() > 1:
        sys.exit(rc)
    flush_stdio()
    os._exit(rc & 0xFF)


def flush_stdio() -> None:
    """Flush stdout and stderr; a reader of stdout that has gone (`| head`) is not an error: what is left
    goes nowhere, as when main catches BrokenPipeError."""
    for f in (sys.stdout, sys.stderr):
        if f is None:  # started with it closed
            continue
        try:
            f.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), f.fileno())  # its buffer is dropped on the next flush
        except (OSError, ValueError):
            pass  # closed by the command, or a file that refuses: the ordinary exit could do no better


if __name__ == "__main__":
    console()
