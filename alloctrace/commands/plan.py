"""`alloctrace plan`: a PyTorch training step's peak, OOM and largest fitting batch, before the run, on a CPU."""
from __future__ import annotations

import argparse
import json
import sys

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe, safe_lines

from ._common import add_store_arg, examples, open_store_from

EXAMPLES = examples(
    "alloctrace plan -- python train.py --batch 32   # predicted max_memory_allocated / max_memory_reserved",
    "alloctrace plan --total 24GiB --alloc-conf expandable_segments:True -- python train.py",
    "alloctrace plan --vary batch=8..512 --budget 80GiB --json -- python train.py --batch {batch}")


def register(subparsers):
    p = subparsers.add_parser(
        "plan", help="predict a PyTorch training step's CUDA memory on a CPU: peaks, OOM, the largest batch",
        description=("Run a PyTorch script on fake CUDA tensors (no GPU, no weights, no data beyond what the "
                     "script makes), record every storage it allocates and frees, and replay that sequence "
                     "through the model of the CUDA caching allocator: predicted max_memory_allocated and "
                     "max_memory_reserved, fragmentation and bytes per category at the peak, and where a card "
                     "of --total bytes would run out of memory. With --vary and --budget: the largest value of "
                     "the knob ({NAME} in the script's arguments) whose step runs under the budget. The predicted "
                     "run is stored as a PyTorch trace (peak, flame, state, report and diff work on it); with --vary, "
                     "the answer's run with every point of the search (the dashboard's /preflight page)."),
        epilog=EXAMPLES,
        usage="%(prog)s [--total SIZE] [--alloc-conf STRING] [--cap SIZE] [--vary NAME=LO..HI --budget SIZE] "
              "[--json] [--no-store] [--name NAME] [--store DIR|URL] -- python SCRIPT [ARGS...]")
    p.add_argument("--total", metavar="SIZE", help="the card's memory the allocator may take (e.g. 80GiB)")
    p.add_argument("--alloc-conf", metavar="STRING", help="as PYTORCH_CUDA_ALLOC_CONF, e.g. "
                   "expandable_segments:True,max_split_size_mb:128")
    p.add_argument("--cap", metavar="SIZE", help="a memory cap (set_per_process_memory_fraction): 6GiB or 50%%")
    p.add_argument("--vary", metavar="NAME=LO..HI", help="the knob to search, e.g. batch=8..512")
    p.add_argument("--budget", metavar="SIZE", help="with --vary: the memory the step must run under")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument("--no-store", action="store_true", help="do not store the predicted run as a trace")
    p.add_argument("--name", help="the stored trace's name (default: plan SCRIPT ARGS)")
    add_store_arg(p)
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="python SCRIPT [ARGS...]")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.preflight import torch_plan
    from alloctrace.traces.preflight.budget import parse_budget
    from alloctrace.traces.util.sizes import parse_size

    if bool(args.vary) != bool(args.budget):
        raise UserError("--vary and --budget go together (e.g. --vary batch=8..512 --budget 80GiB)")
    total = None
    if args.total:
        try:
            total = parse_size(args.total)
        except ValueError as e:
            raise UserError(f"--total wants a size such as 80GiB: {e}") from None
    budget = parse_budget(args.budget) if args.budget else None
    knob = torch_plan.parse_range(args.vary) if args.vary else None
    settings = torch_plan.settings_from(args.alloc_conf, total, args.cap)
    argv = torch_plan.script_argv(args.program)
    if knob:
        plans: dict = {}
        out = torch_plan.vary_script(argv, knob[0], knob[1], knob[2], budget, settings, keep=plans)
        out["name"] = knob[0]
        if not args.no_store:
            from alloctrace.traces.preflight.torch_plan_store import store_vary

            out.update(store_vary(open_store_from(args, create=True), out, plans, settings, total,
                                  args.name or (f"plan --vary {args.vary} " + " ".join(argv))[:200]))
        print(json.dumps(out, indent=1) if args.json else safe_lines(vary_lines(out)))
        return 0 if out["value"] is not None else 1
    result = torch_plan.run_script(argv, settings, total)
    out = result.as_dict()
    if not args.no_store:
        from alloctrace.traces.preflight.torch_plan_store import store_plan

        out["trace"] = store_plan(open_store_from(args, create=True), result.capture, settings, total,
                                  args.name or ("plan " + " ".join(argv))[:200])
    print(json.dumps(out, indent=1) if args.json else safe_lines(plan_lines(out)))
    if result.partial:
        print(safe(f"alloctrace: the step stopped under fake tensors (the prediction covers the part before): "
                   f"{result.error}"), file=sys.stderr)
        return 3
    return 1 if result.oom else 0


def plan_lines(out: dict) -> list[str]:
    from alloctrace.traces.util.sizes import fmt_bytes

    def b(n):
        return f"{n:,} B ({fmt_bytes(n)})"

    lines = [f"predicted peak allocated  {b(out['peak_allocated'])}   (max_memory_allocated)",
             f"predicted peak reserved   {b(out['peak_reserved'])}   (max_memory_reserved)",
             f"fragmentation at the peak {b(out['fragmentation_at_peak'])}",
             address_line(out),
             "at the peak allocated: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in out["categories"].items()),
             f"included: cuBLAS workspace {fmt_bytes(out['cublas_workspace'])} per handle (CUBLAS_WORKSPACE_CONFIG)",
             out["unseen"]]
    convs = sum(out.get("unmeasured_workspaces", {}).values())
    if convs:
        lines.insert(-1, f"not included: cuDNN's workspaces of {convs:,} convolution calls (cuDNN picks them on the "
                         "GPU at run time; the Python API adds a table measured there: docs/torch-plan.md)")
    if out.get("trace"):
        lines.append(f"stored as trace {out['trace']} (alloctrace peak / flame / state / report {out['trace']})")
    if out["partial"]:
        lines.insert(0, "PARTIAL: the step stopped before its end; the numbers cover the part before")
    if out["oom"]:
        o = out["oom"]
        where = f" ({o['op']} at {o['site']})" if o["site"] else f" ({o['op']})"
        lines.append(f"would OOM on a card with {fmt_bytes(o['cap'] or o['total'])} at entry {o['event']}{where}: "
                     f"request {b(o['request'])}, largest free block {b(o['largest_free'])}, "
                     f"reserved {b(o['reserved'])}, allocated {b(o['allocated'])}")
    return lines


def address_line(out: dict) -> str:
    """How the peaks move with where the driver puts new segments (Plan.address_sensitive)."""
    n, (a0, a1), (r0, r1) = out["address_orders"], out["peak_allocated_range"], out["peak_reserved_range"]
    if not out["address_sensitive"]:
        return f"the same at every segment address order ({n} tried)"
    ooms = f"; {out['oom_orders']} of them run out of memory" if out["oom_orders"] else ""
    mine = (f" (the answer places them as {out['driver_order_source']})"
            if out.get("driver_order_source") else "")
    return (f"depends on where the driver puts segments: allocated {a0:,}-{a1:,} B, reserved {r0:,}-{r1:,} B "
            f"over {n} address orders{ooms}{mine}")


def vary_lines(out: dict) -> list[str]:
    from alloctrace.traces.util.sizes import fmt_bytes

    name, budget = out["name"], out["budget"]
    stored = [f"stored as plan {out['plan']} (trace {out['trace']}; the curve: alloctrace serve, then "
              f"/preflight?id={out['plan']})"] if out.get("plan") else []
    if out["value"] is None:
        return [f"nothing fits {fmt_bytes(budget)} ({budget:,} B): {name} {out['points'][0]['value']} already "
                f"runs out of memory", *stored]
    lines = [f"largest {name} that runs under {fmt_bytes(budget)} ({budget:,} B): {out['value']}  "
             f"({len(out['points'])} points captured)"]
    a = out["address_orders"]
    if not a["certain"]:
        every = out["value_every_order"]
        lines.append(f"  it depends on where the driver puts segments: {out['value']} runs out of memory in "
                     f"{a['oom_at_value']} of {a['orders_at_value']} address orders, {out['value'] + 1} fits in "
                     f"{a['fit_above_value']} of {a['orders_above_value']}; "
                     f"{every if every is not None else 'nothing'} fits in every one")
    for p in out["points"]:
        lines.append(f"  {name} {p['value']}: reserved {p['peak_reserved']:,} B, allocated "
                     f"{p['peak_allocated']:,} B  {'fits' if p['fits'] else 'OOM'}")
    for cat, law in out["laws"].items():
        lines.append(f"  {cat}: {law['a']:,} + {law['b_per_unit']:,}·{name} B"
                     f"{'' if law['linear'] else ' (not linear across the points)'}")
    return lines + stored
