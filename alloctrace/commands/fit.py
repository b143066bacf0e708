"""`alloctrace fit`: the largest value of a flag whose recorded run fits a memory budget."""
from __future__ import annotations

import argparse
import json
import sys

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe, safe_lines

from ._common import add_retry_hung_arg, add_store_arg, examples, open_store_from, retried_line, retry_hung_of

EXAMPLES = examples(
    "alloctrace fit --budget 8GiB --vary=-c=512..131072 --step 256 -- llama-fit-params -m model.gguf -v"
    "   # the longest context whose weights, KV cache and compute buffer fit 8 GiB",
    "alloctrace fit --budget 64MiB --compute-only --vary=-ub=32..4096 -- llama-fit-params -m model.gguf -c 8192")


def register(subparsers):
    p = subparsers.add_parser(
        "fit", help="the largest value of a flag whose run fits a memory budget (bisection over recorded runs)",
        description=("Run PROGRAM under the recorder with FLAG set to values between LOW and HIGH, bisecting for "
                    "the largest value whose memory fits BUDGET: the exact compute buffers ggml made, plus the "
                    "weights, every KV cache (a sliding-window model has two) and the output buffers the program "
                    "printed (llama.cpp with -v); the answer and the value one step above are checked against the "
                    "program's own memory breakdown. Assumes the "
                    "total grows with the value. Prints the answer and what fills the budget there; the answer's "
                    "run is stored as a trace. Write --vary=-c=512..131072 (with '=': the flag starts with a dash)."),
        epilog=EXAMPLES,
        usage="%(prog)s --budget SIZE --vary=FLAG=LOW..HIGH [--step N] [--compute-only] [--json] -- PROGRAM [ARGS...]")
    p.add_argument("--budget", required=True, metavar="SIZE", help="memory budget: 8GiB, 512MiB, 6GB, or bytes")
    p.add_argument("--vary", required=True, metavar="FLAG=LOW..HIGH", help="the flag to fit and its range")
    p.add_argument("--step", type=int, default=1, help="only multiples of N above LOW (default 1)")
    p.add_argument("--compute-only", action="store_true",
                   help="count only the compute buffers, not the weights and KV cache the program printed")
    add_store_arg(p)
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="kill a run that takes longer and report it as timed out (default 900; 0: no limit)")
    add_retry_hung_arg(p)
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
    flag, lo, hi = parse_range(args.vary)
    timeout, retry_hung = timeout_of(args), retry_hung_of(args)  # refused before a store is made
    store = open_store_from(args, create=True)

    def progress(pr):
        print(safe(f"{flag} {pr.value}: {pr.total:,} B {'fits' if pr.total <= budget else 'does not fit'}"),
              file=sys.stderr, flush=True)

    out = fit(store, command, flag, lo, hi, budget, recorder_library(), step=args.step,
              compute_only=args.compute_only, progress=progress, timeout=timeout, retry_hung=retry_hung)
    print(json.dumps(out, indent=1) if args.json else safe_lines(report_lines(out)))
    return 0 if out["value"] is not None else 1


def timeout_of(args) -> float | None:
    """--timeout as run_points takes it: the default when not given, None for 0 (no limit)."""
    from alloctrace.traces.preflight.points import DEFAULT_TIMEOUT

    if args.timeout is None:
        return DEFAULT_TIMEOUT
    if args.timeout < 0:
        raise UserError(f"--timeout wants seconds (0: no limit), got {args.timeout:g}")
    return args.timeout or None


def ignored_line(flags: list[str]) -> list[str]:
    """The flags the program said it ignores (llama.cpp without a GPU backend), as one line."""
    if not flags:
        return []
    return [f"note: ignored by this build of the program (it says so in its output): {', '.join(flags)}; "
            "its memory here is that of a run without them"]


def report_lines(out: dict) -> list[str]:
    from alloctrace.traces.preflight.breakdown import check_lines
    from alloctrace.traces.util.sizes import fmt_bytes

    flag, budget = out["flag"], out["budget"]
    if out["value"] is None:
        nxt = out["next"]
        return [f"nothing fits {fmt_bytes(budget)} ({budget:,} B): already {flag} {nxt['value']} needs "
                f"{fmt_bytes(nxt['total'])} ({nxt['total']:,} B)"] + retried_lines(out) + \
            ignored_line(out.get("ignored") or [])
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
                lines.append(f"  {kind.replace('_', ' ')} on {dev}  {mib:.2f} MiB (as the program printed it)")
    if p["families"]:
        lines.append("  compute buffer at its peak: " + ", ".join(
            f"{f['family']} {fmt_bytes(f['bytes'])}" for f in p["families"][:4]))
    lines.append(f"  checked against what the program printed at {flag} {out['value']}:")
    lines += check_lines(out.get("check"), "    ")
    nxt = out["next"]
    if nxt:
        lines.append(f"  {flag} {nxt['value']} would need {fmt_bytes(nxt['total'])} ({nxt['total']:,} B), "
                     f"{fmt_bytes(nxt['total'] - budget)} over; checked against what the program printed there:")
        lines += check_lines(nxt.get("check"), "    ")
    lines.append(f"  every run of the search, drawn: alloctrace serve, then /preflight?id={out['sweep']}")
    return lines + retried_lines(out) + ignored_line(out.get("ignored") or [])


def retried_lines(out: dict) -> list[str]:
    """The probes (and the answer's stored run) whose program hung and was run again."""
    lines = [line for pr in out["probes"] for line in retried_line(f"{out['flag']} {pr['value']}", pr.get("retried"))]
    return lines + retried_line(f"the stored run at {out['flag']} {out['value']}", (out["point"] or {}).get("retried"))
