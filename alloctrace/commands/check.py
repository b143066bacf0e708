"""`alloctrace check`: is an allocation plan safe, not only does it fit.

Builds the plan the chosen allocator generation makes for a graph, runs the
static hazard check and, with --numeric, executes the plan on a byte arena
against a private-memory reference. Exit status 4 when anything is found.

Graph sources are small functions returning plans (`_harness_plans`,
`_preset_plans`, `_trace_plans`); a new source adds one and a line in `_plans`.
Stored traces can be checked when they came from `alloctrace replay`: the
preset run is rebuilt from the trace's description and must reproduce it.
"""
from __future__ import annotations

import json

from alloctrace.errors import UserError
from alloctrace.traces.textsafe import safe, safe_lines

EXIT_HAZARDS = 4


def register(subparsers):
    p = subparsers.add_parser("check", help="check an allocation plan for memory hazards",
                              description="Check an allocation plan for memory hazards (overwritten live "
                                          "tensors, stale reads, overlaps inside concurrent Metal levels). "
                                          "Exit status 4 when any are found.")
    p.add_argument("trace_id", nargs="?", help="a stored trace to check (needs the trace store)")
    p.add_argument("--harness", metavar="JSON", help="a harness graph description (fixtures/ggml-real/*/harness_*.json)")
    p.add_argument("--preset", metavar="NAME", help="a model preset's graph (e.g. gpt2-tiny)")
    p.add_argument("--profile", default="ggml-2023-08-28", help="allocator generation (default: %(default)s)")
    p.add_argument("--parse-seq", action="store_true",
                   help="use the graph's parse_seq; its levels run concurrently, as Metal dispatched them")
    p.add_argument("--metal-concurrency", action="store_true",
                   help="with --preset: compute Metal's parse_seq for the graph and run its levels concurrently")
    p.add_argument("--hparam", action="append", default=[], metavar="KEY=VALUE",
                   help="with --preset: override a hyper-parameter (repeatable), e.g. --hparam n_layer=2")
    p.add_argument("--serial", action="store_true", help="run parse_seq levels one node after another")
    p.add_argument("--buffer-size", type=int, metavar="BYTES",
                   help="2023 flow: real compute buffer size (default: the harness's, or measured + alignment)")
    p.add_argument("--numeric", action="store_true", help="also execute the plan and compare with a reference")
    p.add_argument("--order", default="adversarial", choices=["adversarial", "shuffled", "graph"],
                   help="order of a concurrent level's nodes in the numeric run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for data and shuffled orders")
    p.add_argument("--json", action="store_true", help="print hazard events as JSON lines")
    p.add_argument("--store", metavar="DIR", default=None,
                   help="with TRACE_ID: trace store directory (default: $ALLOCTRACE_STORE or the per-user one)")
    p.set_defaults(func=run)


# --- graph sources ---------------------------------------------------------------------------
def _harness_plans(args):
    from alloctrace.metal_exec.plan import harness_plans

    try:
        with open(args.harness) as f:
            desc = json.load(f)
    except OSError as e:
        raise UserError(f"cannot read {args.harness}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{args.harness} is not JSON: {e.msg} (line {e.lineno})") from None
    if not isinstance(desc, dict) or not ("nodes" in desc or "graphs" in desc):
        raise UserError(f"{args.harness} is not a harness graph description (no nodes or graphs)")
    try:
        return harness_plans(desc, args.profile, args.parse_seq, concurrent=False if args.serial else None,
                             buffer_size=args.buffer_size)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise UserError(f"{args.harness}: {e}") from None


def _hparams(items) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--hparam wants KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _preset_plans(args):
    """The eval graph of a model preset, planned as the program did (measure, then the real buffer)."""
    try:
        from alloctrace.metal_exec.plan import preset_plans
    except ImportError:
        raise UserError("checking presets is not available in this build; use --harness") from None
    try:
        return preset_plans(args.preset, args.profile, metal_concurrency=args.metal_concurrency,
                            serial=args.serial, hparams=_hparams(args.hparam), buffer_size=args.buffer_size)
    except ValueError as e:
        raise UserError(str(e)) from None


def _trace_plans(args):
    """A stored replay trace: its preset run is rebuilt and must reproduce the stored eval max_size.

    Traces imported from logs keep events, not tensor shapes and sources, so they cannot be checked."""
    from alloctrace.metal_exec.plan import preset_plans
    from alloctrace.traces.store import open_store

    store = open_store(args.store)
    try:
        tid, _ = store.resolve(args.trace_id)
        meta = store.meta(tid)
        preset = (meta.extra or {}).get("preset")
        if meta.source != "replay" or not preset:
            raise UserError(f"trace {tid} came from {meta.source}: it holds allocator events but not the graph's "
                            f"shapes, so it cannot be checked; check its preset or harness graph instead")
        graphs = store.summary(tid)["graphs"]
        stored_eval = next((g for g in graphs if g["role"] == "eval"), None)
    finally:
        store.close()
    x = meta.extra
    try:
        return preset_plans(preset["name"].removesuffix("(custom)"), meta.profile or meta.generation,
                            metal_concurrency=x.get("parse_seq_len") is not None, serial=args.serial,
                            hparams=preset.get("hparams"), n_ctx=x["measure_tokens"] + x["measure_n_past"],
                            eval_shape=(x["eval_tokens"], x["eval_n_past"]), layout=x.get("layout"),
                            expect_max_size=stored_eval["max_size"] if stored_eval else None)
    except (KeyError, TypeError) as e:
        raise UserError(f"trace {tid}: its replay description is incomplete ({e})") from None
    except ValueError as e:
        raise UserError(f"trace {tid}: {e}") from None


def _plans(args):
    given = [x for x in (args.trace_id, args.harness, args.preset) if x]
    if len(given) != 1:
        raise UserError("give exactly one of TRACE_ID, --harness JSON or --preset NAME")
    if args.metal_concurrency and not args.preset:
        raise UserError("--metal-concurrency needs --preset (a harness graph brings its own parse_seq)")
    from alloctrace.allocator import PROFILES
    if args.profile not in PROFILES:
        raise UserError(f"unknown profile {args.profile!r}; known: {', '.join(PROFILES)}")
    if args.harness:
        return _harness_plans(args)
    if args.preset:
        return _preset_plans(args)
    return _trace_plans(args)


# --- the command ------------------------------------------------------------------------------
def _mode(plan) -> str:
    if plan.concurrent:
        return f"{len(plan.levels)} concurrent levels"
    return "serial"


def run(args) -> int:
    from alloctrace.metal_exec.execute import describe, run as execute
    from alloctrace.metal_exec.hazards import check, summary
    from alloctrace.metal_exec.kernels import UnsupportedOp

    found = 0
    for plan in _plans(args):
        hazards = check(plan)
        found += len(hazards)
        print(f"graph {plan.graph_index}: {plan.profile}, {plan.graph.n_nodes} nodes, {_mode(plan)}, "
              f"buffer {plan.buffer_size} bytes: {len(hazards)} hazard{'s' if len(hazards) != 1 else ''}")
        if plan.note:
            print(safe(f"  note: {plan.note}"))
        if plan.unallocated:
            names = ", ".join(t.name for t in plan.unallocated)
            print(safe(f"  note: the allocator left {names} without memory (run in private memory here)"))
        if args.json:
            for ev in hazards:
                print(json.dumps(ev.to_dict()))
        elif hazards:
            print(safe_lines("  " + line for line in summary(hazards).splitlines()))
        if args.numeric:
            try:
                result = execute(plan, order=args.order, seed=args.seed)
            except UnsupportedOp as e:
                raise UserError(f"numeric run: {e}") from None
            print(safe(f"  numeric ({args.order}): {describe(result)}"))
            if not result.ok:
                found += 1
    return EXIT_HAZARDS if found else 0
