"""`alloctrace list`: the stored traces, newest first."""
from __future__ import annotations

import json

from ._common import add_store_arg, examples, open_store_from, traces_table


EXAMPLES = examples(
    'alloctrace list --store ./store',
    'alloctrace list -q "my run" --store ./store   # names containing "my run"',
    'alloctrace list --json --store ./store')


def register(subparsers):
    p = subparsers.add_parser("list", help="list stored traces", description="List stored traces, newest first.")
    add_store_arg(p)
    p.add_argument("-q", metavar="TEXT", dest="q",
                   help="only traces whose name contains TEXT; KEY=VALUE words: only traces with all those tags")
    p.add_argument("--tag", metavar="KEY=VALUE", action="append", default=[], dest="tags",
                   help="only traces with this tag (repeatable)")
    p.add_argument("--json", action="store_true", help="print the traces as JSON")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.store.graph_info import with_uncertainty

    store = open_store_from(args)
    summaries = with_uncertainty(store, store.list(args.q, args.tags))
    if args.json:
        print(json.dumps({"traces": summaries}, indent=1))
    else:
        print(traces_table(summaries))
    return 0
