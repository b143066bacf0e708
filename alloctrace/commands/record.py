"""`alloctrace record`: run an unmodified ggml program and record its graph allocator."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from alloctrace.traces.errors import UserError

from ._common import add_store_arg, open_store_from, traces_table


def register(subparsers):
    p = subparsers.add_parser(
        "record", help="run a ggml program (llama.cpp, whisper.cpp, ...) and record its graph allocator",
        description="Run PROGRAM with a small preloaded library that records every plan and placement of ggml's "
                    "graph allocator (ggml_gallocr), then replay them through the ggml-head model and store the "
                    "trace (or write the raw recording with -o). The program's output passes through and its "
                    "exit status is returned. Linux; the program must use ggml as a shared library.",
        usage="%(prog)s [--store DIR] [--name NAME] [-o FILE] [--ggml-include PATH] -- PROGRAM [ARGS...]")
    add_store_arg(p)
    p.add_argument("--name", help="trace name (default: the program's name)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the raw recording to FILE instead of importing it")
    p.add_argument("--ggml-include", metavar="PATH",
                   help="ggml.h (or its directory) the program was built with: read tensors with its layout "
                        "instead of the one chosen by ggml's version")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.sources.record.build import find_ggml_header, recorder_library
    from alloctrace.traces.sources.record.run import run_recorded
    from alloctrace.traces.sources.record.source import NO_GGML

    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise UserError("record: name the program to run, after --")
    header = find_ggml_header(args.ggml_include) if args.ggml_include else None
    library = recorder_library(header)
    with tempfile.TemporaryDirectory(prefix="alloctrace-rec-") as tmp:
        result = run_recorded(command, library, Path(tmp))
        if not result.recordings:
            print(f"alloctrace: error: {NO_GGML}", file=sys.stderr)
            return result.exit_status or 2
        if args.output:
            _write_output(result.recordings, Path(args.output))
            print(f"alloctrace: recording written to {args.output}", file=sys.stderr)
            return result.exit_status
        name = args.name or program_name(command)
        store = open_store_from(args)
        ids = import_into_store(store, result.recordings, name)
    print(traces_table([store.summary(t) for t in ids]), file=sys.stderr)
    return result.exit_status


def program_name(command: list[str]) -> str:
    """The program's file name; through `env VAR=... PROGRAM`, PROGRAM's."""
    words = command
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if "=" not in w and not w.startswith("-")] or words
    return os.path.basename(words[0])


def import_into_store(store, recordings: list[Path], name: str) -> list[str]:
    """Each recording file into the store, through the one import entry point (all or nothing)."""
    from alloctrace.traces.sources import import_files

    return [s["id"] for s in import_files(store, recordings, name=name, progress=sys.stderr.isatty())]


def _write_output(recordings: list[Path], out: Path):
    tmp = out.with_name(out.name + ".part")
    try:
        with open(tmp, "wb") as dst:
            for path in recordings:
                with open(path, "rb") as src:
                    shutil.copyfileobj(src, dst)
        os.replace(tmp, out)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
