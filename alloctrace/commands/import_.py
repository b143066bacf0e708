"""`alloctrace import`: store ggml AT_PRINTF logs, JSON Lines exports, recordings or PyTorch snapshots as traces."""
from __future__ import annotations

import json
import os
import sys

from alloctrace.traces.replay.catalog import profile_names

from ._common import add_store_arg, add_tag_arg, examples, open_store_from, tags_from, traces_table


EXAMPLES = examples(
    'alloctrace import run.log --store ./store --name "my run"   # a ggml log with AT_PRINTF lines',
    'alloctrace import snapshot.pickle.gz --store ./store   # a PyTorch memory snapshot',
    'alloctrace import cut.log.zst --salvage --store ./store   # keep the graphs of a cut file',
    'alloctrace import snapshots/ --name ddp --store ./store   # per-rank snapshots: one trace, a device per rank',
    'alloctrace import run.atrec --tag commit=abc123 --tag config=fa-on   # tags for compare and history')


def register(subparsers):
    p = subparsers.add_parser("import", help="import traces (ggml-alloc logs, exports, PyTorch snapshots; plain, .gz, .zst, .xz)",
                              description="Import files of any trace source: ggml-alloc AT_PRINTF logs of any "
                                          "generation (detected automatically), alloctrace JSON Lines exports, "
                                          "PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot "
                                          "pickles, read without running pickle code) (the source is recognised from the content). Each file becomes "
                                          "its trace(s), all in one transaction: if any file fails (or the command is killed), "
                                          "nothing is stored. A file stored before with the same tags (its content "
                                          "hash) is not stored again: a re-run skips it and names its trace(s).")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="files to import; a directory: its PyTorch snapshots, one per rank, as one trace")
    add_store_arg(p)
    p.add_argument("--name", help="trace name (default: the file name)")
    p.add_argument("--generation", metavar="G",
                   help=f"allocator generation of a ggml log, overriding detection: {profile_names()}")
    add_tag_arg(p)
    p.add_argument("--json", action="store_true", help="print the imported traces as JSON")
    p.add_argument("--max-bytes", "--max-decompressed", dest="max_decompressed", metavar="BYTES",
                   help="refuse a file that decompresses to more than this (e.g. 512M; default 64M for a "
                        "compressed file, none for a plain one; or $ALLOCTRACE_MAX_DECOMPRESSED)")
    p.add_argument("--max-cpu", metavar="SECONDS",
                   help="CPU time allowed per file (default 900, or $ALLOCTRACE_MAX_IMPORT_CPU)")
    p.add_argument("--ranks", action="store_true",
                   help="the PyTorch snapshots named are the ranks of one job: one trace, a device per rank "
                        "(a directory always is)")
    p.add_argument("--salvage", action="store_true",
                   help="import what a truncated compressed file holds; the trace is marked truncated "
                        "and its last graph incomplete")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.sources.bounded_io import Limits, parse_amount
    from alloctrace.traces.sources import import_files
    from alloctrace.traces.sources.ggml_log.import_log import check_generation

    check_generation(args.generation)
    tags = tags_from(args)
    limits = Limits.from_env(
        max_decompressed=None if args.max_decompressed is None else int(parse_amount(args.max_decompressed,
                                                                                      "--max-bytes")),
        max_cpu_s=None if args.max_cpu is None else parse_amount(args.max_cpu, "--max-cpu"),
        salvage=args.salvage or None)
    store = open_store_from(args, create=True)
    if args.ranks or any(os.path.isdir(p) for p in args.paths):
        from alloctrace.traces.sources.ranks import import_ranks

        summaries = import_ranks(store, args.paths, name=args.name, limits=limits, tags=tags)
    else:
        summaries = import_files(store, args.paths, name=args.name, generation=args.generation,
                                 progress=sys.stderr.isatty(), limits=limits, tags=tags)
    from alloctrace.traces.store.graph_info import uncertainty_text, with_uncertainty

    with_uncertainty(store, summaries)
    for s in summaries:  # a log that fits more than one generation says which it was read as
        if s.get("stored_before"):
            print(f"alloctrace: {s['name']}: stored before as {s['id']} (not stored again)", file=sys.stderr)
            continue
        note = store.meta(s["id"]).extra.get("generation_note")
        if note:
            print(f"alloctrace: {s['name']}: {note}", file=sys.stderr)
        unsure = uncertainty_text(s.get("graphs") or [])
        if unsure:
            print(f"alloctrace: {s['name']}: sizes {unsure}", file=sys.stderr)
    if args.verbose:
        from alloctrace.traces.sources.ggml_log import fastlog
        from alloctrace.traces.sources.record import plans_fast

        for line in (fastlog.path_line(), plans_fast.path_line()):
            print(f"alloctrace: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps({"traces": [import_json(s) for s in summaries]}, indent=1))
    else:
        print(traces_table(summaries))
    return 0


def import_json(summary: dict) -> dict:
    """A stored trace as `import --json` prints it: a source's own report (e.g. a snapshot's devices)
    stands in for the generic generation and graph rows."""
    out = {k: summary[k] for k in ("id", "name", "source")}
    if summary.get("stored_before"):
        out["stored_before"] = True
    if summary.get("report"):
        out.update(summary["report"])
    else:
        out.update(generation=summary["generation"], graphs=summary["graphs"])
    return out
