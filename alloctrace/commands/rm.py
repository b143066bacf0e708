"""`alloctrace rm`: delete a stored trace."""
from __future__ import annotations

from alloctrace.traces.util.textsafe import safe

from ._common import add_store_arg, examples, open_store_from


EXAMPLES = examples(
    'alloctrace rm 59b3150c --store ./store')


def register(subparsers):
    p = subparsers.add_parser("rm", help="delete a stored trace", description="Delete a stored trace.")
    p.add_argument("id", metavar="ID", help="trace id (a unique prefix is enough)")
    add_store_arg(p)
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    store = open_store_from(args)
    tid = store.resolve(args.id.partition(":")[0])[0]
    store.delete(tid)
    print(f"removed {safe(tid)}")
    return 0
