"""`alloctrace compare`: the buffers of two commits' traces, paired by their other tags; exit 1 on growth."""
from __future__ import annotations

import json

from alloctrace.traces.util.textsafe import safe_lines

from ._common import add_store_arg, open_store_from

EXAMPLES = """examples:
  alloctrace import base.atrec --tag commit=abc123 --tag config=fa-on
  alloctrace import head.atrec --tag commit=def456 --tag config=fa-on
  alloctrace compare --base commit=abc123 --head commit=def456
  alloctrace compare --base commit=abc123 --head commit=def456 --threshold 1% --markdown > comment.md
  alloctrace compare --base branch=main --head commit=def456 --threshold 1MiB --json
  alloctrace compare --base-ref origin/main --head commit=def456 --allow-unpaired

exit status: 0 no buffer grew past the threshold, 1 one did, 2 bad input (or no trace has a side's tags),
3 unpaired: nothing paired, or a side has traces that pair with nothing (unless --allow-unpaired)"""


def register(subparsers):
    import argparse

    p = subparsers.add_parser(
        "compare", help="compare two commits' buffers, pairing traces by their other tags; exit 1 on growth",
        description="Pair the traces tagged --base with those tagged --head by their other key=value tags "
                    "(model, config, ...; not `order`), print each pair's buffers (per buffer type) with the "
                    "delta and the size attribution by tensor family of every change, and exit 1 when any "
                    "buffer grew past --threshold.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    side = p.add_mutually_exclusive_group(required=True)
    side.add_argument("--base", action="append", metavar="KEY=VALUE",
                      help="the base side's tag (repeatable: all must match), e.g. commit=abc123")
    side.add_argument("--base-ref", metavar="REF",
                      help="git ref of the base branch (origin/main): the base is the nearest recorded commit "
                           "from the merge base of HEAD and REF back (first parents), else the newest trace "
                           "tagged branch=NAME; the answer says which commit and how far back")
    p.add_argument("--base-branch", metavar="NAME",
                   help="with --base-ref: the branch tag to fall back on (default: REF's branch, origin/main -> main)")
    p.add_argument("--repo", metavar="DIR", default=".", help="with --base-ref: the git repository (default: .)")
    p.add_argument("--walk", metavar="N", type=int, default=200,
                   help="with --base-ref: how many first-parent commits to look at (default 200)")
    p.add_argument("--head", action="append", required=True, metavar="KEY=VALUE",
                   help="the head side's tag (repeatable), e.g. commit=def456")
    p.add_argument("--threshold", metavar="SIZE|PCT", default="0",
                   help="growth allowed per buffer: bytes (4096, 1MiB) or percent of the base (1%%); default 0")
    p.add_argument("--allow-unpaired", action="store_true",
                   help="exit 0/1 even when some traces pair with nothing (nothing paired at all still exits 3)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the comparison as JSON")
    out.add_argument("--markdown", action="store_true", help="print a markdown table for a pull-request comment")
    add_store_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.regress.compare import Threshold, compare
    from alloctrace.traces.regress.compare_report import markdown, text_lines

    threshold = Threshold.parse(args.threshold)
    store = open_store_from(args)
    baseline = None
    if args.base_ref is not None:
        from alloctrace.traces.regress.baseline import from_git

        baseline = from_git(store, args.repo, args.base_ref, branch=args.base_branch, walk=args.walk)
    result = compare(store, [baseline.tag] if baseline else args.base, args.head, threshold)
    result.baseline = baseline.to_json() if baseline else None
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    elif args.markdown:
        print(markdown(result), end="")
    else:
        print(safe_lines(text_lines(result)))
    return result.status(args.allow_unpaired)
