"""`alloctrace import`: store real ggml AT_PRINTF logs (or JSON Lines exports) as traces."""
from __future__ import annotations

import json
import sys

from ._common import add_store_arg, open_store_from, traces_table


def register(subparsers):
    p = subparsers.add_parser("import", help="import ggml-alloc logs (plain, .gz, .zst) into the trace store",
                              description="Import ggml-alloc AT_PRINTF logs of any generation (detected "
                                          "automatically) or alloctrace JSON Lines exports. Each file becomes "
                                          "one trace; if any file fails, nothing is stored.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files")
    add_store_arg(p)
    p.add_argument("--name", help="trace name (default: the file name)")
    p.add_argument("--generation", metavar="G",
                   help="allocator generation, overriding detection: ggml-2023-08-16, ggml-2023-08-22, "
                        "ggml-2023-08-28, ggml-2023-10, ggml-2024-02, ggml-head")
    p.add_argument("--json", action="store_true", help="print the imported traces as JSON")
    p.add_argument("--max-decompressed", metavar="BYTES",
                   help="refuse a file that decompresses to more than this (e.g. 512M; default 2G, "
                        "or $ALLOCTRACE_MAX_DECOMPRESSED)")
    p.add_argument("--max-cpu", metavar="SECONDS",
                   help="CPU time allowed per file (default 900, or $ALLOCTRACE_MAX_IMPORT_CPU)")
    p.add_argument("--salvage", action="store_true",
                   help="import what a truncated compressed file holds; the trace is marked truncated "
                        "and its last graph incomplete")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.bounded_io import Limits, parse_amount
    from alloctrace.traces.import_log import check_generation, import_paths

    check_generation(args.generation)
    limits = Limits.from_env(
        max_decompressed=None if args.max_decompressed is None else int(parse_amount(args.max_decompressed,
                                                                                      "--max-decompressed")),
        max_cpu_s=None if args.max_cpu is None else parse_amount(args.max_cpu, "--max-cpu"),
        salvage=args.salvage or None)
    store = open_store_from(args)
    ids = import_paths(store, args.paths, name=args.name, generation=args.generation, progress=sys.stderr.isatty(),
                       limits=limits)
    summaries = [store.summary(t) for t in ids]
    if args.json:
        keys = ("id", "name", "source", "generation", "graphs")
        print(json.dumps({"traces": [{k: s[k] for k in keys} for s in summaries]}, indent=1))
    else:
        print(traces_table(summaries))
    return 0
