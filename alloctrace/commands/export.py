"""`alloctrace export`: a stored trace as JSON Lines, CSV or Chrome trace JSON (Perfetto)."""
from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from alloctrace.traces.errors import UserError
from alloctrace.traces.export.formats import FORMATS, writer as export_writer
from alloctrace.traces.store.kinds import trace_kind

from ._common import add_store_arg, examples, open_store_from


EXAMPLES = examples(
    'alloctrace export 59b3150c --format chrome -o trace.json --store ./store   # open in ui.perfetto.dev',
    'alloctrace export 59b3150c --format jsonl -o trace.jsonl --store ./store   # lossless; `import` reads it back',
    'alloctrace export 59b3150c --format csv --store ./store > events.csv',
    'alloctrace export 3c9e01aa --format chrome -o torch.json --store ./store   # a PyTorch trace: a track per stream',
    'alloctrace export 3c9e01aa --format jsonl --store ./store | jq -c \'select(.type=="entry")\'')


def register(subparsers):
    p = subparsers.add_parser("export", help="export a stored trace",
                              description="Export a stored trace: jsonl (lossless, re-importable), csv (events), "
                                          "chrome (Chrome trace JSON; open it in Perfetto or chrome://tracing). "
                                          "A PyTorch trace: chrome (a process per device or rank, a track per "
                                          "stream with each allocation's lifetime, counters of allocated and "
                                          "reserved bytes) or jsonl (everything it stores: `import` reads it back as "
                                          "the same trace).")
    p.add_argument("id", metavar="ID", help="trace id (a unique prefix is enough)")
    p.add_argument("--format", required=True, choices=list(FORMATS))
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")
    add_store_arg(p)
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    store = open_store_from(args)
    tid = store.resolve(args.id.partition(":")[0])[0]
    writer = export_writer(trace_kind(store, tid), args.format, store, tid)
    with ExportProgress(sys.stderr) as progress:
        if not args.output:
            writer(_Flushing(sys.stdout), progress)
            return 0
        write_output(Path(args.output), lambda f: writer(f, progress))
    return 0


class _Flushing:
    """Standard output flushed after each graph, so a pipe's reader gets the first graph at once."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str):
        self.out.write(text)
        self.out.flush()


class ExportProgress:
    """`graph 12/302` on stderr while an export runs, when stderr is a terminal (a bar from rich); silent
    otherwise, so scripts and logs see only the export."""

    def __init__(self, stream):
        self.stream, self.bar, self.task = stream, None, None

    def __enter__(self):
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("exporting graphs"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self.bar.start()
        return self

    def __call__(self, done: int, total: int):
        if self.bar is None:
            return
        if self.task is None:
            self.task = self.bar.add_task("export", total=total)
        self.bar.update(self.task, completed=done)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def write_output(out: Path, write) -> None:
    """Write `out` the way a shell redirection would, but atomically for regular files.

    A FIFO or a character device (/dev/null, /dev/stdout, a terminal) is written directly:
    replacing it would destroy it. A regular file (or what a symlink points to) is replaced
    atomically, keeping its permissions; a new file gets the usual 0666 & ~umask. Anything
    else (a directory, a socket, a block device) is refused."""
    try:
        st = os.stat(out)  # follows a symlink to what it names
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UserError(f"{out}: is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
            raise UserError(f"{out}: not a regular file, a FIFO or a character device; refusing to write it")
        try:
            with open(out, "w", newline="") as f:
                write(f)
        except OSError as e:
            raise UserError(f"cannot write {out}: {e.strerror}") from None
        return
    target = Path(os.path.realpath(out)) if out.is_symlink() else out  # the link stays a link
    mode = stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent if str(target.parent) else ".")
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", newline="") as f:
            write(f)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as e:
        os.unlink(tmp)
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    except BaseException:
        os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
