"""`alloctrace record`: run an unmodified program and record its allocator: ggml's graph allocator through a
preloaded library, PyTorch's CUDA caching allocator through a `sitecustomize` hook."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from alloctrace.traces.errors import UserError

from ._common import add_store_arg, add_tag_arg, examples, open_store_from, tags_from, traces_table


TIMED_OUT = 124  # the exit status of a program stopped at --timeout, as timeout(1) gives it

EXAMPLES = examples(
    'alloctrace record --store ./store -- llama-completion -m model.gguf -p hello -n 4',
    'alloctrace record --name "ctx 4096" --store ./store -- llama-fit-params -m model.gguf -c 4096',
    'alloctrace record --ggml -o run.rec -- python my_ggml_program.py   # keep the raw recording',
    'alloctrace record --store ./store -- python train.py --epochs 1   # PyTorch: CUDA memory from import torch',
    'alloctrace record --torch --stacks all -- ./train.sh   # a wrapper that starts Python; C++ frames too',
    'alloctrace record --name ddp -- torchrun --nproc_per_node 2 train.py   # one trace, a device per rank',
    'alloctrace record -o snap.pickle -- python train.py   # keep the snapshot, store nothing',
    'alloctrace record --tag commit=abc123 --tag config=fa-off -- llama-completion -m m.gguf -fa off -n 1',
    'alloctrace record --timeout 600 -- python train.py   # stopped after 10 minutes, what it did kept (exit 124)')


def register(subparsers):
    import argparse

    p = subparsers.add_parser(
        "record", help="run a program and record its allocator (ggml's graph allocator, or PyTorch's CUDA memory)",
        description="Run PROGRAM and record its allocator, then store the trace (or write the raw recording "
                    "with -o). ggml programs (llama.cpp, whisper.cpp, ...): a small preloaded library records "
                    "every plan and placement of ggml's graph allocator (Linux; ggml as a shared library), "
                    "replayed through the ggml-head model. Python programs (a python interpreter, torchrun, a "
                    "#! python script; or --torch): a sitecustomize put first on PYTHONPATH switches "
                    "torch.cuda.memory._record_memory_history on right after the program imports torch, and "
                    "dumps the snapshot at exit, on an uncaught OutOfMemoryError and on SIGTERM; every process "
                    "that used CUDA writes one (torchrun: one per rank, stored as one trace with a device per "
                    "rank). A Python program gets both recorders unless --torch or --ggml picks one. The "
                    "program's output passes through and its exit status is returned.",
        usage="%(prog)s [--store DIR|URL] [--name NAME] [--tag KEY=VALUE ...] [-o FILE] [--torch | --ggml] [--stacks python|all] "
              "[--max-entries N] [--timeout SECONDS] [--ggml-include PATH] -- PROGRAM [ARGS...]")
    add_store_arg(p)
    add_tag_arg(p)
    p.add_argument("--name", help="trace name (default: the program's name)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the raw recording to FILE instead of importing it (PyTorch: the snapshot pickle; "
                        "several processes: FILE is a directory of them)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--torch", action="store_true", help="record PyTorch's CUDA memory only")
    which.add_argument("--ggml", action="store_true", help="record ggml's graph allocator only")
    p.add_argument("--stacks", choices=("python", "all"), default="python",
                   help="PyTorch: the frames recorded with each entry (all: C++ frames too, slower)")
    p.add_argument("--max-entries", type=int, default=1_000_000, metavar="N",
                   help="PyTorch: entries kept (the history is a ring buffer; default 1,000,000)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the program when it runs longer (SIGTERM, SIGKILL 10 s later); what it recorded "
                        "until then is stored, and the command exits 124")
    p.add_argument("--ggml-include", metavar="PATH",
                   help="ggml.h (or its directory) the program was built with: read tensors with its layout "
                        "instead of the one chosen by ggml's version")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def args_from(argv: list[str]):
    """The arguments `register`'s parser gives `argv`, when traces/sources/early.py reads it in full (the usual
    `record [--store DIR] [--name NAME] [--tag K=V ...] [--ggml] -- PROGRAM ...`): without argparse, which
    with its parser costs the command's start about 2.5 ms. Else None: argparse reads it (and says what is
    wrong with it). tests/record/test_record_args.py holds both to the same answers."""
    from types import SimpleNamespace

    from alloctrace.traces.sources.early import record_argv

    line = record_argv(argv)
    if line is None:
        return None
    return SimpleNamespace(global_verbose=False, command="record", verbose=False, store=line.store, tags=line.tags,
                           name=line.name, output=None, torch=False, ggml=line.ggml, stacks="python",
                           max_entries=1_000_000, ggml_include=None, timeout=None, program=["--", *line.program],
                           func=run)


def run(args) -> int:
    from alloctrace.traces.sources import early
    from alloctrace.traces.sources.record.build import find_ggml_header, recorder_library
    from alloctrace.traces.sources.record.run import run_recorded
    from alloctrace.traces.sources.record.source import no_allocator_calls
    from alloctrace.traces.sources.record.program import is_python_program
    from alloctrace.traces.util import gcpause

    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise UserError("record: name the program to run, after --")
    if args.max_entries < 1:
        raise UserError("--max-entries must be at least 1")
    if args.timeout is not None and not args.timeout > 0:
        raise UserError(f"--timeout wants a number of seconds above 0, got {args.timeout:g}")
    tags = tags_from(args)
    if tags and args.output:
        raise UserError("record: --tag labels stored traces; with -o nothing is stored (give the tags to "
                        "`alloctrace import --tag` of the recording)")
    torch = args.torch or (not args.ggml and is_python_program(command))
    ggml = not args.torch
    library = None
    if ggml:
        header = find_ggml_header(args.ggml_include) if args.ggml_include else None
        try:
            library = recorder_library(header)
        except UserError:
            if not torch:
                raise
    if torch:  # the PyTorch hook's side, imported only for a Python program
        from alloctrace.traces.sources.torch.recorder import hook_env, nothing_recorded, snapshots_in
    started = early.take(command, library, torch) if not args.output else None
    if started is None:
        early.abandon()
    gcpause.start_done()  # the entry point's pause (traces/util/gcpause.py): what runs next is imported
    with _folder(started) as tmp:
        snap_dir = Path(tmp) / "torch"
        snap_dir.mkdir()
        env = hook_env(snap_dir, args.stacks, args.max_entries) if torch else None
        result = run_recorded(command, library, Path(tmp), env, started, args.timeout)
        status = result.exit_status
        if result.stopped_by:
            status = TIMED_OUT
            print(f"alloctrace: the program ran past --timeout {args.timeout:g} s and was stopped "
                  f"({result.stopped_by}); what it recorded until then is kept", file=sys.stderr)
        snaps = snapshots_in(snap_dir) if torch else []
        if not result.recordings and not snaps:
            why = nothing_recorded(snap_dir, ggml) if torch else no_allocator_calls(
                result.exit_status, None, _program_path(command))
            print(f"alloctrace: error: {why}", file=sys.stderr)
            return status or 2
        for s in snaps:
            who = f"rank {s.rank}" if s.rank is not None else f"process {s.facts.get('pid', '?')}"
            print(f"alloctrace: CUDA memory snapshot of {who} dumped at {s.facts.get('reason', 'exit')}",
                  file=sys.stderr)
        if args.output:
            if result.recordings:
                _write_output(result.recordings, Path(args.output))
            else:
                _write_snapshots([s.path for s in snaps], Path(args.output))
            print(f"alloctrace: recording written to {args.output}", file=sys.stderr)
            return status
        name = args.name or program_name(command)
        store = open_store_from(args, create=True)
        stored = import_into_store(store, result.recordings, name, tags, own_recording=True) \
            if result.recordings else []
        if snaps:
            stored += import_snapshots(store, [s.path for s in snaps], name, tags)
    print(traces_table(stored), file=sys.stderr)  # the summaries the import answered: not read again
    return status


def _program_path(command: list[str]) -> str | None:
    from alloctrace.traces.sources.record.program import resolve_program

    try:
        return resolve_program(command)
    except UserError:
        return None


def _folder(started):
    """The run's private folder: the one the early-started program writes into (removed at the end), else a
    new one."""
    if started is None:
        import tempfile

        return tempfile.TemporaryDirectory(prefix="alloctrace-rec-")
    import contextlib

    from alloctrace.traces.sources.record.program import remove_folder

    @contextlib.contextmanager
    def owned():
        try:
            yield started.folder
        finally:
            remove_folder(started.folder)
    return owned()


def program_name(command: list[str]) -> str:
    """The program's file name; through `env VAR=... PROGRAM`, PROGRAM's."""
    words = command
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if "=" not in w and not w.startswith("-")] or words
    return os.path.basename(words[0])


def import_into_store(store, recordings: list[Path], name: str, tags=(), own_recording: bool = False) -> list[dict]:
    """Each recording file into the store, through the one import entry point (all or nothing): the new
    traces' summaries. `own_recording`: the ggml recorder's files of this run (a small one is read in this
    process, sources.read_file)."""
    from alloctrace.traces.sources import import_files

    return import_files(store, recordings, name=name, progress=sys.stderr.isatty(), tags=tags,
                        own_recording=own_recording)


def import_snapshots(store, paths: list[Path], name: str, tags=()) -> list[dict]:
    """One process's snapshot as a trace; several (ranks, workers) as one trace with a device each."""
    from alloctrace.traces.sources.ranks import import_ranks

    if len(paths) == 1:
        return import_into_store(store, paths, name, tags)
    return import_ranks(store, paths, name=name, tags=tags)


def _write_snapshots(paths: list[Path], out: Path):
    import shutil

    try:
        if len(paths) == 1:
            _write_output(paths, out)
            return
        out.mkdir(parents=True, exist_ok=True)
        for p in paths:
            for f in (p, p.with_suffix(".json")):
                if f.exists():
                    shutil.copyfile(f, out / f.name)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None


def _write_output(recordings: list[Path], out: Path):
    import shutil

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
