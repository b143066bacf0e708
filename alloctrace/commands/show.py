"""`alloctrace show`: one trace's metadata and graphs."""
from __future__ import annotations

import json

from ._common import add_store_arg, examples, graphs_table, open_store_from


EXAMPLES = examples(
    'alloctrace show 59b3150c --store ./store',
    'alloctrace show 59b3 --json --store ./store   # a unique prefix is enough')


def register(subparsers):
    p = subparsers.add_parser("show", help="show a stored trace", description="Show a stored trace and its graphs.")
    p.add_argument("id", metavar="ID", help="trace id (a unique prefix is enough)")
    add_store_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.store.graph_info import with_uncertainty

    store = open_store_from(args)
    summary = with_uncertainty(store, [store.summary(args.id)])[0]  # sizes a log cannot pin down say so
    print(json.dumps(summary, indent=1) if args.json else graphs_table(summary))
    return 0
