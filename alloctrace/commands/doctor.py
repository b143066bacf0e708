"""`alloctrace doctor`: read every stored trace back and list (and, asked to, delete) what is damaged."""
from __future__ import annotations

import json
import sys

from alloctrace.traces.util.textsafe import safe

from ._common import add_store_arg, examples, open_store_from

EXAMPLES = examples(
    "alloctrace doctor --store ./store   # list damaged traces (exit status 1 if any)",
    "alloctrace doctor --store ./store --delete   # delete them, after asking",
    "alloctrace doctor --store ./store --delete --yes   # delete them without asking (scripts)")


def register(subparsers):
    p = subparsers.add_parser(
        "doctor", help="check that every stored trace reads back; list or delete damaged ones",
        description="Read every trace of the store back (metadata, tags, every graph's columns and strings, "
                    "state checkpoints and memory-map lifetimes) and list what is damaged: a flipped bit, a "
                    "hand edit, a cut write. --delete deletes damaged traces (and drops damaged derived rows, "
                    "which are made again from the graph's columns). Only damage the stored bytes show (a "
                    "checksum or a decoding that fails) is deleted; a trace that could not be checked (out of "
                    "memory) is listed apart and never deleted. Exit status: 0 nothing damaged (or all of it "
                    "deleted) and everything checked, 1 damage found and kept, or something could not be "
                    "checked.")
    add_store_arg(p)
    p.add_argument("--delete", action="store_true", help="delete the damaged traces (asks first, unless --yes)")
    p.add_argument("-y", "--yes", action="store_true", help="with --delete: do not ask")
    p.add_argument("--json", action="store_true", help="print what was found as JSON")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.store.doctor import examine, repair

    store = open_store_from(args)
    n, damage, unchecked = examine(store)
    if args.json and not args.delete:
        print(json.dumps({"traces": n, "damaged": [d.to_dict() for d in damage],
                          "unchecked": [u.to_dict() for u in unchecked]}, indent=1))
        return 1 if damage or unchecked else 0
    for d in damage:
        print(f"{safe(d.trace)}  {safe(d.name)}: {safe(d.problem)}")
    for u in unchecked:
        where = "" if u.graph is None else f" graph {u.graph}"
        print(f"{safe(u.trace)}  {safe(u.name)}: could not check{where}: {u.reason} (kept)")
    if unchecked:
        print(f"{len({u.trace for u in unchecked})} of {n} traces could not be checked: run doctor again with "
              "more memory free")
    if not damage:
        if not unchecked:
            print(f"{n} traces, all readable")
        return 1 if unchecked else 0
    traces = {d.trace for d in damage}
    print(f"{len(traces)} of {n} traces damaged" + ("" if args.delete else "; --delete deletes them"))
    if not args.delete:
        return 1
    if not args.yes and not _confirm(f"delete {len(traces)} damaged trace(s)? [y/N] "):
        print("nothing deleted")
        return 1
    deleted, dropped = repair(store, damage)
    print(f"deleted {len(deleted)} trace(s)" + (f"; dropped {dropped} damaged derived row set(s), made again "
                                                 "on next use" if dropped else ""))
    return 1 if unchecked else 0


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False  # a script must say --yes
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False
