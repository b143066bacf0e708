"""`alloctrace store copy SRC DST`: copy the traces of one store into another (SQLite folder or PostgreSQL)."""
from __future__ import annotations

import json
import sys

from alloctrace.traces.util.textsafe import safe

from ._common import examples

EXAMPLES = examples(
    "alloctrace store copy ./store postgresql://ci@db.example:5432/traces   # a folder's traces into a shared database",
    "alloctrace store copy postgresql://ci@db.example/traces ./backup   # and back: a folder to keep or mail",
    "alloctrace store copy ./store ./other --json   # what was copied, as JSON")


def register(subparsers):
    p = subparsers.add_parser(
        "store", help="work on whole stores: copy one store's traces into another (store copy SRC DST)",
        description="Whole-store actions. `store copy SRC DST` copies every trace of the store SRC that DST "
                    "lacks into DST (each a store folder or a PostgreSQL URL / libpq key=value string, either "
                    "way), keeping ids, names, tags, created times, every graph's bytes and derived rows. Each "
                    "trace is one transaction in DST, so a copy that is stopped keeps whole traces and a re-run "
                    "copies only what is missing. Every graph is checked against its content checksum before "
                    "it leaves SRC and after it lands in DST. Exit status: 0 everything is in DST, 1 a damaged "
                    "trace of SRC was left out or DST holds an id with other content (both are named).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    c = actions.add_parser("copy", help="copy the traces of SRC that DST lacks into DST",
                           description="Copy the traces of store SRC that store DST lacks into DST (see `alloctrace "
                                       "store --help`).")
    for where in (p, c):
        where.epilog = EXAMPLES
    c.add_argument("src", metavar="SRC", help="the store to copy from: a folder or a PostgreSQL URL")
    c.add_argument("dst", metavar="DST", help="the store to copy into (made when missing)")
    c.add_argument("--json", action="store_true", help="print what was copied as JSON")
    c.set_defaults(func=run_copy)


def run_copy(args) -> int:
    from alloctrace.traces.errors import UserError
    from alloctrace.traces.store.copy import copy_store
    from alloctrace.traces.store.store import open_store

    if args.src == args.dst:
        raise UserError("SRC and DST are the same store")
    src = open_store(args.src, create=False)
    dst = open_store(args.dst)
    if src.path is not None and dst.path is not None and src.path.resolve() == dst.path.resolve():
        raise UserError("SRC and DST are the same store")

    def progress(n, total, tid):
        if sys.stderr.isatty():
            print(f"\r{n + 1}/{total} {tid}", end="", file=sys.stderr, flush=True)
    report = copy_store(src, dst, progress=progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        print(json.dumps({"copied": report.copied, "present": report.present, "conflicts": report.conflicts,
                          "damaged": report.damaged}, indent=1))
    else:
        for msg in report.damaged:
            print(f"left out: {safe(msg)}")
        for tid in report.conflicts:
            print(f"left alone: {tid} is in the destination with other content")
        print(f"copied {len(report.copied)} trace(s); {len(report.present)} were there already"
              + (f"; {len(report.damaged)} damaged left out" if report.damaged else "")
              + (f"; {len(report.conflicts)} conflicting" if report.conflicts else ""))
    return 0 if report.complete else 1
