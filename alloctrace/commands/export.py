"""`alloctrace export`: a stored trace as JSON Lines, CSV or Chrome trace JSON (Perfetto)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from alloctrace.traces.errors import UserError

from ._common import add_store_arg, open_store_from


def register(subparsers):
    p = subparsers.add_parser("export", help="export a stored trace",
                              description="Export a stored trace: jsonl (lossless, re-importable), csv (events), "
                                          "chrome (Chrome trace JSON; open it in Perfetto or chrome://tracing).")
    p.add_argument("id", metavar="ID", help="trace id (a unique prefix is enough)")
    p.add_argument("--format", required=True, choices=["jsonl", "csv", "chrome"])
    p.add_argument("-o", "--output", metavar="FILE", help="write here (default: standard output)")
    add_store_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.export import export

    store = open_store_from(args)
    tid = store.resolve(args.id.partition(":")[0])[0]
    if store.meta(tid).source == "torch":
        raise UserError(f"trace {tid} is a PyTorch snapshot: export covers allocator event traces; see "
                        "`alloctrace peak`, `alloctrace diff` and the dashboard's /torch page")
    if not args.output:
        export(store, tid, args.format, sys.stdout)
        return 0
    out = Path(args.output)
    if out.is_dir():
        raise UserError(f"{out}: is a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent if str(out.parent) else ".")
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", newline="") as f:
            export(store, tid, args.format, f)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return 0
