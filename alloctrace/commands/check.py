"""`alloctrace check`: is an allocation plan safe, not only does it fit.

Builds the plan the chosen allocator generation makes for a graph, runs the
static hazard check and, with --numeric, executes the plan on a byte arena
against a private-memory reference. Exit status 4 when anything is found.

The plans, the memory estimate and the checks are the use case in traces/replay/hazard_check.py (a new graph
source is one function there); this module parses, prints and draws the numeric run's progress.
Stored traces can be checked when they came from `alloctrace replay`: the
preset run is rebuilt from the trace's description and must reproduce it.
"""
from __future__ import annotations

import argparse
import json

from alloctrace.traces.errors import UserError
from alloctrace.traces.replay.catalog import DEFAULT_PROFILE, profile_names
from alloctrace.traces.replay.hazard_check import MEMORY_SHARE
from alloctrace.traces.util.textsafe import safe, safe_lines

from ._common import examples, hparams

EXIT_HAZARDS = 4


def _size_arg(text: str) -> int:
    """'2G', '512M', '1.5GiB' or plain bytes (util/sizes.parse_size)."""
    from alloctrace.traces.util.sizes import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


EXAMPLES = examples(
    "alloctrace check --preset gpt2-tiny --profile ggml-2023-08-28 --metal-concurrency   # hazards of Metal's concurrent levels",
    'alloctrace check --harness tests/data/ggml-real/v2023-08-28-parseseq/harness_parseseq.json --parse-seq   # a harness graph (from a clone of the repository)',
    'alloctrace check --preset gpt2-tiny --profile ggml-2023-08-28 --numeric   # also run the plan on numbers, against a reference',
    'alloctrace check 59b3150c --store ./store   # a stored trace')


def register(subparsers):
    p = subparsers.add_parser("check", help="check an allocation plan for memory hazards",
                              description="Check an allocation plan for memory hazards (overwritten live "
                                          "tensors, stale reads, overlaps inside concurrent Metal levels). "
                                          "Exit status 4 when any are found.")
    p.add_argument("trace_id", nargs="?", help="a stored trace to check (needs the trace store)")
    p.add_argument("--harness", metavar="JSON", help="a harness graph description: the JSON beside a harness log, e.g. "
                        "tests/data/ggml-real/v2023-08-28-parseseq/harness_plain.json in a clone")
    p.add_argument("--preset", metavar="NAME", help="a model preset's graph (e.g. gpt2-tiny)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"allocator generation: {profile_names()} "
                                                              "(default: %(default)s)")
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
    p.add_argument("--max-memory", metavar="SIZE", type=_size_arg,
                   help="with --numeric: refuse runs that would allocate more than SIZE (e.g. 2G, 512M; "
                        f"default: {int(MEMORY_SHARE * 100)}%% of MemAvailable)")
    p.add_argument("--order", default="adversarial", choices=["adversarial", "shuffled", "graph"],
                   help="order of a concurrent level's nodes in the numeric run (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for data and shuffled orders")
    p.add_argument("--json", action="store_true", help="print hazard events as JSON lines")
    p.add_argument("--store", metavar="DIR|URL", default=None,
                   help="with TRACE_ID: trace store directory or PostgreSQL URL (default: $ALLOCTRACE_STORE or the per-user one)")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def _request(args):
    from alloctrace.traces.replay.hazard_check import PlanRequest

    return PlanRequest(trace_id=args.trace_id, harness=args.harness, preset=args.preset, profile=args.profile,
                       parse_seq=args.parse_seq, metal_concurrency=args.metal_concurrency, serial=args.serial,
                       buffer_size=args.buffer_size, hparams=hparams(args.hparam), store=args.store)


def _numeric(plan, args):
    """The numeric run, with a progress bar on stderr (only drawn on a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from alloctrace.traces.replay.hazard_check import numeric_run

    columns = (TextColumn("numeric run, graph {task.fields[graph]}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=2 * len(plan.graph.nodes), graph=plan.graph_index)
        return numeric_run(plan, args.order, args.seed, on_node=lambda: bar.advance(task))


# --- the command ------------------------------------------------------------------------------
def _mode(plan) -> str:
    if plan.concurrent:
        return f"{len(plan.levels)} concurrent levels"
    return "serial"


def run(args) -> int:
    from alloctrace.traces.replay.hazard_check import (describe_numeric, hazard_summary, hazards as check,
                                                       plans_for, refuse_if_too_big)

    if args.max_memory and not args.numeric:
        raise UserError("--max-memory limits the numeric run: add --numeric")
    req = _request(args)
    plans = plans_for(req)
    if args.numeric:
        refuse_if_too_big(req, plans, args.max_memory)
    found = 0
    for plan in plans:
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
            print(safe_lines("  " + line for line in hazard_summary(hazards).splitlines()))
        if args.numeric:
            result = _numeric(plan, args)
            print(safe(f"  numeric ({args.order}): {describe_numeric(result)}"))
            if not result.ok:
                found += 1
    return EXIT_HAZARDS if found else 0
