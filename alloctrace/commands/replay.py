"""`alloctrace replay`: run a preset's measure and eval graphs the way the program did."""
from __future__ import annotations

import json
import os

from alloctrace.traces.replay.catalog import profile_names
from alloctrace.traces.util.sizes import fmt_bytes
from alloctrace.traces.util.textsafe import safe_lines

from ._common import examples, hparams


EXAMPLES = examples(
    'alloctrace replay --preset llama2-70b --profile ggml-2023-08-16 --metal-concurrency --store ./store',
    'alloctrace replay --preset llama-7b --profile ggml-2023-08-28 --n-ctx 2048 --n-batch 512',
    'alloctrace replay --preset gpt2-tiny --profile ggml-head --json')


def register(subparsers):
    p = subparsers.add_parser(
        "replay", help="replay a real program's measure + eval allocation on a model preset",
        description="Build the worst-case graph, measure it, size the buffer as the program did, then allocate "
                    "the eval graph in it. Exit 0 when the eval fits, 3 when an allocator ran out of space.")
    p.add_argument("--preset", required=True, help="preset name (see `alloctrace presets`)")
    p.add_argument("--profile", required=True, help=f"allocator generation: {profile_names(presets_only=True)}")
    p.add_argument("--n-ctx", type=int, help="context size (default: the preset's)")
    p.add_argument("--n-batch", type=int, help="batch size (default: the program's)")
    p.add_argument("--eval-tokens", type=int, help="tokens in the eval graph (default: as measured)")
    p.add_argument("--n-past", type=int, help="n_past of the eval graph (default: as measured)")
    p.add_argument("--metal-concurrency", action="store_true",
                   help="reorder nodes with Metal's concurrency list (parse_seq), as llama.cpp did on Apple GPUs")
    p.add_argument("--layout", choices=["linux", "macos-metal"],
                   help="address-space layout (default: macos-metal with --metal-concurrency, else linux)")
    p.add_argument("--hparam", action="append", default=[], metavar="KEY=VALUE",
                   help="override a hyper-parameter (repeatable), e.g. --hparam n_layer=4")
    p.add_argument("--store", metavar="DIR|URL", default=os.environ.get("ALLOCTRACE_STORE") or None,
                   help="store both graphs as one trace in this store (a directory or a PostgreSQL URL; default: "
                        "$ALLOCTRACE_STORE when set, else nothing is stored)")
    p.add_argument("--keep-copies", action="store_true",
                   help="with --store: store the replay even when an identical one is stored already (by default "
                        "the earlier trace is kept and named, as the API does)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def summary_lines(r) -> list[str]:
    """The human-readable summary of a ReplayResult."""
    how = "Metal concurrency order" if r.parse_seq is not None else "graph order"
    lines = [f"replay {r.preset.name} ({r.preset.family}), profile {r.profile}, layout {r.layout}, {how}"]
    if r.concurrency is not None:
        c = r.concurrency
        over = (f"overflows the {c.capacity}-entry list of Aug 2023" if c.overflows
                else f"fits the {c.capacity}-entry list of Aug 2023")
        lines.append(f"  parse_seq: {c.length} entries ({c.length - c.n_levels} nodes + {c.n_levels} barriers), {over}")
    m, e = r.measure, r.eval
    lines.append(f"  measure: {m.n_tokens} tokens, n_past {m.n_past}, {m.n_nodes} nodes: "
                 f"max_size {m.max_size} B ({fmt_bytes(m.max_size)})")
    if m.alloc.failed is not None:
        lines.append(f"  measure FAILED: {m.alloc.failed.reason or m.alloc.failed.kind} at {m.alloc.failed.tensor}")
    lines.append(f"  buffer: {e.buffer_size} B at {e.buffer_base:#x}; compute buffer total {r.compute_buffer_total} B "
                 f"= {r.compute_buffer_total / 1024 / 1024:.2f} MB")
    line = f"  eval: {e.n_tokens} tokens, n_past {e.n_past}, {e.n_nodes} nodes: max_size {e.max_size} B"
    f = e.alloc.failed
    if f is None and m.alloc.failed is None:
        line += " - fits"
    elif f is not None and f.kind == "oom":
        line += (f" - OUT OF SPACE allocating {f.tensor}: needed {f.needed} B, "
                 f"largest block available {f.largest} B")
    elif f is not None:
        line += f" - FAILED at {f.tensor}: {f.reason}"
    lines.append(line)
    if r.first_divergence:
        words = r.first_divergence.get("words") or json.dumps(r.first_divergence)
        lines.append(f"  first divergence: {words}")
    if r.trace_id is not None:
        lines.append(f"  stored as trace {r.trace_id} (graph {r.trace_id}:0 measure, {r.trace_id}:1 eval)")
    return lines


def _store_once(r, ref) -> bool:
    from alloctrace.traces.replay.reuse import store_once
    from alloctrace.traces.store.store import open_store

    store = open_store(ref)
    try:
        return store_once(r, store)
    finally:
        store.close()


def run(args) -> int:
    from alloctrace.traces.replay.run import EXIT_OOM, replay, store_result

    r = replay(args.preset, args.profile, n_ctx=args.n_ctx, n_batch=args.n_batch, eval_tokens=args.eval_tokens,
               n_past=args.n_past, metal_concurrency=args.metal_concurrency, layout=args.layout,
               hparams=hparams(args.hparam))
    reused = False
    if args.store:
        if args.keep_copies:
            store_result(r, args.store)
        else:
            reused = _store_once(r, args.store)
    if args.json:
        print(json.dumps({**r.to_json(), "reused": reused} if args.store else r.to_json(), indent=2))
    else:
        print(safe_lines(summary_lines(r)))
        if reused:
            print(f"  identical to the stored trace {r.trace_id}: kept that one (--keep-copies stores another)")
    return EXIT_OOM if r.failed else 0
