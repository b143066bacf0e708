"""`alloctrace fit`: the largest value of a flag whose recorded run fits a memory budget."""
from __future__ import annotations

import argparse
import json
import sys

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe, safe_lines

from ._common import add_store_arg, add_timeout_arg, checked_timeout, examples, open_store_from

EXAMPLES = examples(
    "alloctrace fit --budget 8GiB --vary=-c=512..131072 --step 256 -- llama-fit-params -m model.gguf -v"
    "   # the longest context whose weights, KV cache and compute buffer fit 8 GiB",
    "alloctrace fit --budget 64MiB --compute-only --vary=-ub=32..4096 -- llama-fit-params -m model.gguf -c 8192")


def register(subparsers):
    p = subparsers.add_parser(
        "fit", help="the largest value of a flag whose run fits a memory budget (bisection over recorded runs)",
        description=("Run PROGRAM under the recorder with FLAG set to values between LOW and HIGH, bisecting for "
                    "the largest value whose memory fits BUDGET: the exact compute buffers ggml made, plus the "
                    "weights, KV cache and output buffers the program printed (llama.cpp with -v). Assumes the "
                    "total grows with the value. Prints the answer and what fills the budget there; the answer's "
                    "run is stored as a trace. Write --vary=-c=512..131072 (with '=': the flag starts with a dash)."),
        epilog=EXAMPLES,
        usage="%(prog)s --budget SIZE --vary=FLAG=LOW..HIGH [--step N] [--compute-only] [--timeout S] [--json] "
              "-- PROGRAM [ARGS...]")
    p.add_argument("--budget", required=True, metavar="SIZE", help="memory budget: 8GiB, 512MiB, 6GB, or bytes")
    p.add_argument("--vary", required=True, metavar="FLAG=LOW..HIGH", help="the flag to fit and its range")
    p.add_argument("--step", type=int, default=1, help="only multiples of N above LOW (default 1)")
    p.add_argument("--compute-only", action="store_true",
                   help="count only the compute buffers, not the weights and KV cache the program printed")
    add_store_arg(p)
    add_timeout_arg(p)
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.preflight.budget import fit, parse_budget
    from alloctrace.traces.preflight.vary import parse_range
    from alloctrace.traces.sources.record.build import recorder_library

    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not command:
        raise UserError("fit: name the program to run, after --")
    budget = parse_budget(args.budget)
    timeout = checked_timeout(args.timeout)
    flag, lo, hi = parse_range(args.vary)
    store = open_store_from(args, create=True)

    def progress(pr):
        print(safe(f"{flag} {pr.value}: {pr.total:,} B {'fits' if pr.total <= budget else 'does not fit'}"),
              file=sys.stderr, flush=True)

    out = fit(store, command, flag, lo, hi, budget, recorder_library(), step=args.step,
              compute_only=args.compute_only, progress=progress, timeout=timeout)
    print(json.dumps(out, indent=1) if args.json else safe_lines(report_lines(out)))
    return 0 if out["value"] is not None else 1


def report_lines(out: dict) -> list[str]:
    from alloctrace.traces.util.sizes import fmt_bytes

    flag, budget = out["flag"], out["budget"]
    note = [f"  {out['ignored']['message']}"] if out.get("ignored") else []
    if out["value"] is None:
        nxt = out["next"]
        return note + [f"nothing fits {fmt_bytes(budget)} ({budget:,} B): already {flag} {nxt['value']} needs "
                f"{fmt_bytes(nxt['total'])} ({nxt['total']:,} B)"]
    p = out["point"]
    lines = [f"largest {flag} that fits {fmt_bytes(budget)} ({budget:,} B): {out['value']}"
             f"  ({len(out['probes'])} runs; stored as trace {p['trace']})",
             f"  total {fmt_bytes(out['total'])} ({out['total']:,} B), "
             f"{fmt_bytes(budget - out['total'])} left"]
    for buft, size in p["buffers"].items():
        lines.append(f"  {buft} compute buffer  {fmt_bytes(size)} ({size:,} B, exact)")
    if not out["compute_only"]:
        for kind in ("weights", "kv_cache", "output", "recurrent_state"):
            for dev, mib in (p["printed"].get(kind) or {}).items():
                lines.append(f"  {kind.replace('_', ' ')} ({dev})  {mib:.2f} MiB (as the program printed it)")
    if p["families"]:
        lines.append("  compute buffer at its peak: " + ", ".join(
            f"{f['family']} {fmt_bytes(f['bytes'])}" for f in p["families"][:4]))
    nxt = out["next"]
    if nxt:
        lines.append(f"  {flag} {nxt['value']} would need {fmt_bytes(nxt['total'])} ({nxt['total']:,} B), "
                     f"{fmt_bytes(nxt['total'] - budget)} over")
    return lines + note
