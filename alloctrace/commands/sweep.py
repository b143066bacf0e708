"""`alloctrace sweep`: one replay per config point; compute buffer size, dominant families, OOM onset."""
from __future__ import annotations

import json
import sys

from alloctrace.allocator.profiles import names as profile_names
from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe_lines


def register(subparsers):
    p = subparsers.add_parser(
        "sweep", help="replay a preset over several n_ctx / n_batch / profiles: buffer size per point",
        description="Replay a preset once per combination of --profile, --n-ctx and --n-batch (each takes "
                    "comma-separated values, repeatable for --profile) and print the compute buffer (the measure "
                    "graph's max_size) per point with the families that dominate its peak, and where each profile "
                    "starts to run out of space. Points come in input order: profile, then n_ctx, then n_batch.")
    p.add_argument("--preset", required=True, help="preset name (see `alloctrace presets`)")
    p.add_argument("--profile", action="append", required=True, metavar="P[,P...]",
                   help=f"allocator generation(s): {profile_names(presets_only=True)}")
    p.add_argument("--n-ctx", metavar="N[,N...]", help="context sizes (default: the preset's)")
    p.add_argument("--n-batch", metavar="N[,N...]", help="batch sizes (default: the program's)")
    p.add_argument("--metal-concurrency", action="store_true", help="Metal's concurrency order, as in `replay`")
    p.add_argument("--json", action="store_true", help="print the points as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.replay.sweep import parse_values, sweep

    profiles = [x.strip() for item in args.profile for x in item.split(",") if x.strip()]
    if not profiles:
        raise UserError("--profile wants at least one profile name")
    n_ctx, n_batch = parse_values(args.n_ctx, "--n-ctx"), parse_values(args.n_batch, "--n-batch")
    with _progress() as advance:
        out = sweep(args.preset, profiles, n_ctx, n_batch, args.metal_concurrency, progress=advance)
    print(json.dumps(out, indent=1) if args.json else safe_lines(report_lines(out)))  # names are data: escaped
    return 0


class _progress:
    """A rich progress bar on stderr while points replay (only on a terminal)."""

    def __enter__(self):
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import Progress

            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task("replaying points", total=None)
        return self.advance

    def advance(self, done: int, total: int):
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def report_lines(out: dict) -> list[str]:
    from alloctrace.traces.explain.peak import text_table
    from alloctrace.traces.util.sizes import fmt_bytes

    rows = [["profile", "n_ctx", "n_batch", "compute buffer", "exact", "oom", "dominant families"]]
    for q in out["points"]:
        if q["error"]:
            rows.append([q["profile"], str(q["n_ctx"]), str(q["n_batch"]), "-", "-", "-", q["error"]])
            continue
        fams = ", ".join(f"{f['family']} {fmt_bytes(f['bytes'])}" for f in q["top_families"][:3])
        rows.append([q["profile"], str(q["n_ctx"]), str(q["n_batch"]), fmt_bytes(q["max_size"]),
                     f"{q['max_size']:,}", "OOM" if q["oom"] else "-", fams])
    lines = [f"sweep {out['preset']}" + (" (Metal concurrency)" if out["metal_concurrency"] else "")]
    lines += ["  " + line for line in text_table(rows)]
    for o in out["oom_onset"]:
        detail = o.get("oom") or {}
        what = (f": {detail.get('tensor')} needed {fmt_bytes(detail.get('needed'))}, largest block "
                f"{fmt_bytes(detail.get('largest_available'))}") if detail else ""
        lines.append(f"out of space from n_ctx {o['n_ctx']}, n_batch {o['n_batch']} with {o['profile']}{what}")
    return lines
