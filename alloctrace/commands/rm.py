"""`alloctrace rm`: delete a stored trace."""
from __future__ import annotations

from alloctrace.traces.util.textsafe import safe

from ._common import add_store_arg, open_store_from


def register(subparsers):
    p = subparsers.add_parser("rm", help="delete a stored trace", description="Delete a stored trace.")
    p.add_argument("id", metavar="ID", help="trace id (a unique prefix is enough)")
    add_store_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    store = open_store_from(args)
    tid = store.resolve(args.id.partition(":")[0])[0]
    store.delete(tid)
    print(f"removed {safe(tid)}")
    return 0
