"""The `alloctrace` command: one subcommand per module in alloctrace/commands/.

The command line is read by argparse (alloctrace/parser.py), or, for `alloctrace record`'s usual one, by
commands/record.py `args_from` without it (the same arguments: tests/record/test_record_args.py). Errors a
user can cause are UserError: one line on stderr, no traceback.
"""
from __future__ import annotations

import os
import sys

from alloctrace.traces.errors import UserError
from alloctrace.traces.util import verbose
from alloctrace.traces.util.textsafe import safe


def build_parser(argv: list[str] | None = None):
    """The whole parser, or with `argv` naming a command, a parser that knows only that command
    (alloctrace/parser.py, imported only when a command line needs it)."""
    from alloctrace.parser import build_parser as build

    return build(argv)


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


def parsed_without_argparse(argv: list[str]):
    """The arguments of a command line its command reads by itself, as argparse would give them; else None.
    Only `record` does (argparse and its parser cost its fixed start about 2.5 ms)."""
    if argv[:1] != ["record"]:
        return None
    from alloctrace.commands import record

    return record.args_from(argv)


def main(argv=None) -> int:
    argv = join_dashed_values(sys.argv[1:] if argv is None else list(argv))
    args = parsed_without_argparse(argv)
    if args is None:
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
