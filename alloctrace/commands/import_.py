"""`alloctrace import`: store real ggml AT_PRINTF logs (or JSON Lines exports) as traces."""
from __future__ import annotations

import json
import sys

from ._common import add_store_arg, open_store_from, traces_table


def register(subparsers):
    p = subparsers.add_parser("import", help="import ggml-alloc logs or PyTorch memory snapshots (plain, .gz, "
                                             ".zst) into the trace store",
                              description="Import ggml-alloc AT_PRINTF logs of any generation (detected "
                                          "automatically), alloctrace JSON Lines exports or PyTorch CUDA memory "
                                          "snapshots (torch.cuda.memory._dump_snapshot pickles, read without "
                                          "running pickle code). Each file becomes one trace; if any file fails, "
                                          "nothing is stored.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="log files")
    add_store_arg(p)
    p.add_argument("--name", help="trace name (default: the file name)")
    p.add_argument("--generation", metavar="G",
                   help="allocator generation, overriding detection: ggml-2023-08-16, ggml-2023-08-22, "
                        "ggml-2023-08-28, ggml-2023-10, ggml-2024-02, ggml-head")
    p.add_argument("--json", action="store_true", help="print the imported traces as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.import_log import check_generation, import_paths

    from alloctrace.traces.torch.source import import_snapshots, is_snapshot_file
    from alloctrace.traces.torch.store import torch_summary

    check_generation(args.generation)
    store = open_store_from(args)
    snapshots = [p for p in args.paths if is_snapshot_file(p)]  # PyTorch memory snapshots
    logs = [p for p in args.paths if p not in snapshots]
    ids = import_snapshots(store, snapshots, name=args.name, progress=sys.stderr.isatty())
    try:
        ids += import_paths(store, logs, name=args.name, generation=args.generation,
                            progress=sys.stderr.isatty()) if logs else []
    except BaseException:
        for t in ids:
            store.delete(t)
        raise
    summaries = [store.summary(t) for t in ids]
    if args.json:
        keys = ("id", "name", "source", "generation", "graphs")
        print(json.dumps({"traces": [torch_summary(store, s["id"]) if s["source"] == "torch"
                                     else {k: s[k] for k in keys} for s in summaries]}, indent=1))
    else:
        print(traces_table(summaries))
    return 0
