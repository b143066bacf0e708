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
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.sources import import_files
    from alloctrace.traces.sources.ggml_log.import_log import check_generation

    check_generation(args.generation)
    store = open_store_from(args)
    summaries = import_files(store, args.paths, name=args.name, generation=args.generation,
                             progress=sys.stderr.isatty())
    if args.json:
        keys = ("id", "name", "source", "generation", "graphs", "report")
        print(json.dumps({"traces": [{k: s[k] for k in keys if k in s} for s in summaries]}, indent=1))
    else:
        print(traces_table(summaries))
    return 0
