"""`alloctrace sweep`: one recorded run of a program per flag combination (or one replay per preset point);
exact compute buffers, dominant families, growth laws."""
from __future__ import annotations

import sys

from alloctrace.traces.replay.catalog import profile_names
from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe, safe_lines


from ._common import add_retry_hung_arg, exact_count, examples, retried_line, retry_hung_of

EXAMPLES = examples(
    "alloctrace sweep --vary=-c=512,4096,32768 --vary=-fa=on,off -- llama-fit-params -m model.gguf -v"
    "   # every -c and -fa combination of llama.cpp's weightless dry run",
    "alloctrace sweep --vary=-ub=128,512 -j 2 --json -- llama-completion -m model.gguf -p hi -n 1 -fit off -v",
    "alloctrace sweep --preset llama-7b --profile ggml-2023-08-16,ggml-2023-08-28 --n-ctx 512,1024,2048"
    "   # replay a built-in preset",
    "alloctrace sweep --preset gpt2-117m --profile ggml-head --n-batch 8,64,512 --json",
    "alloctrace sweep --vary=-fa=on,off --tag commit=$(git rev-parse --short HEAD) -- llama-completion -m m.gguf -v"
    "   # tagged points for `alloctrace compare`")


def register(subparsers):
    import argparse

    from ._common import add_store_arg

    p = subparsers.add_parser(
        "sweep", help="run a ggml program once per flag combination (or replay a preset): exact buffers per point",
        description=("With --vary: run PROGRAM once per combination of the varied flags (each --vary replaces or "
                    "adds that flag in ARGS), each under the recorder, up to -j at a time, and store each point as "
                    "a trace tagged sweep=ID. Prints one row per point: the values, each buffer type's compute "
                    "buffer in exact bytes, the weights and each KV cache the program printed, the total and "
                    "whether it agrees with the program's own memory breakdown, consistency and the families that "
                    "dominate its peak; then each family's growth law and the size attribution "
                    "between neighbouring points. Write --vary=-c=512,4096 (with '=': the flag starts with a "
                    "dash). With --preset: replay a built-in preset once per combination of --profile, --n-ctx and "
                    "--n-batch instead."),
        epilog=EXAMPLES,
        usage="%(prog)s --vary=FLAG=V1,V2,... [--vary ...] [-j N] [--json] [--store DIR] -- PROGRAM [ARGS...]\n"
              "       %(prog)s --preset P --profile G[,G...] [--n-ctx N,...] [--n-batch N,...] [--json]")
    p.add_argument("--vary", action="append", metavar="FLAG=V1,V2,...",
                   help="a flag of PROGRAM and its values (repeatable; points are all combinations)")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="programs run at once (default: the cores divided by the program's -t/--threads; one at a "
                        "time when it is not given one, as llama.cpp then uses every core)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="kill a point's program that runs longer; the point is 'timed out' (default 900; 0: none)")
    add_retry_hung_arg(p)
    p.add_argument("--name", help="trace name prefix (default: the program's name)")
    add_store_arg(p)
    p.add_argument("--preset", help="replay this preset instead (see `alloctrace presets`)")
    p.add_argument("--profile", action="append", metavar="P[,P...]",
                   help=f"with --preset: allocator generation(s): {profile_names(presets_only=True)}")
    p.add_argument("--n-ctx", metavar="N[,N...]", help="with --preset: context sizes (default: the preset's)")
    p.add_argument("--n-batch", metavar="N[,N...]", help="with --preset: batch sizes (default: the program's)")
    p.add_argument("--metal-concurrency", action="store_true", help="Metal's concurrency order, as in `replay`")
    p.add_argument("--json", action="store_true", help="print the points as JSON")
    p.add_argument("--tag", metavar="KEY=VALUE", action="append", default=[], dest="tags",
                   help="tag every point's trace (repeatable), e.g. --tag commit=abc123; with --preset the points "
                        "are then stored too, each tagged config=PROFILE/cN_CTX/bN_BATCH")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]")
    p.set_defaults(func=run)


def run(args) -> int:
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.vary:
        if args.preset:
            raise UserError("sweep: --vary runs a program, --preset replays a preset: give one of them")
        return run_program(args, command)
    if command:
        raise UserError("sweep: a program to run needs --vary FLAG=VALUES (or use --preset without a program)")
    if not args.preset or not args.profile:
        raise UserError("sweep: give --vary=FLAG=VALUES -- PROGRAM ..., or --preset P --profile G")
    import json

    from alloctrace.traces.replay.sweep import parse_values, sweep

    profiles = [x.strip() for item in args.profile for x in item.split(",") if x.strip()]
    if not profiles:
        raise UserError("--profile wants at least one profile name")
    n_ctx, n_batch = parse_values(args.n_ctx, "--n-ctx"), parse_values(args.n_batch, "--n-batch")
    from alloctrace.traces.store.tags import parse_tags
    tags = parse_tags(args.tags)
    with _progress() as advance:
        out = sweep(args.preset, profiles, n_ctx, n_batch, args.metal_concurrency, progress=advance)
    if tags:
        store_points(out, args, tags)
    print(json.dumps(out, indent=1) if args.json else safe_lines(report_lines(out)))  # names are data: escaped
    return 0


def store_points(out: dict, args, tags: list[str]):
    """Each preset point that replayed, stored as its trace (both graphs) with `tags` and its config; the trace
    id goes into the point (`trace_id`). All or nothing: a failure removes the points stored before it."""
    from alloctrace.traces.replay.run import replay, store_result

    from ._common import open_store_from

    store, done = open_store_from(args, create=True), []
    try:
        for q in out["points"]:
            if q["error"]:
                continue
            r = replay(q["preset"], q["profile"], n_ctx=q["n_ctx"], n_batch=q["n_batch"],
                       metal_concurrency=args.metal_concurrency)
            config = f"config={q['profile']}/c{q['n_ctx']}/b{q['n_batch']}"
            q["trace_id"] = store_result(r, store, [*tags, config])
            done.append(q["trace_id"])
    except BaseException:
        for tid in done:
            store.delete(tid)
        raise
    finally:
        store.close()


def run_program(args, command: list[str]) -> int:
    import functools

    from alloctrace.traces.preflight.points import run_points
    from alloctrace.traces.preflight.vary import parse_vary, points as combinations

    from .fit import timeout_of
    from alloctrace.traces.sources.record.build import recorder_library

    from ._common import open_store_from

    if not command:
        raise UserError("sweep: name the program to run, after --")
    if args.jobs is not None and not 1 <= args.jobs <= 256:
        raise UserError(f"-j wants 1 to 256 programs at once, got {args.jobs}")
    from alloctrace.traces.store.tags import parse_tags
    tags = parse_tags(args.tags)
    varies = [parse_vary(v) for v in args.vary]
    timeout, retry_hung = timeout_of(args), retry_hung_of(args)
    total = len(combinations(varies))
    store = functools.cache(lambda: open_store_from(args, create=True))  # opened once the workers run programs
    library = recorder_library()
    with _progress("recording points") as advance:
        sid, points = run_points(store, command, varies, library, jobs=args.jobs, name=args.name,
                                 progress=lambda done, n, p: advance(done, n, p), tags=tags,
                                 timeout=timeout, retry_hung=retry_hung)
    import json

    from alloctrace.traces.preflight.sweeps import sweep_json

    out = sweep_json(store(), sid, [[v.flag, list(v.values)] for v in varies], points)
    print(json.dumps(out, indent=1) if args.json else safe_lines(program_lines(out)))
    assert total == len(points)
    return 0 if all(p.error is None for p in points) else 1


def program_lines(out: dict) -> list[str]:
    from alloctrace.traces.explain.peak_types import text_table
    from alloctrace.traces.util.sizes import fmt_bytes
    from alloctrace.traces.preflight.laws import dominance_lines, law_lines

    pts = out["points"]
    flags = [f for f, _ in out["vary"]]
    bufts = list(dict.fromkeys(b for p in pts for b in p["buffers"]))
    # one column per printed size: each KV cache (a sliding-window model's second one too) on its own
    printed = list(dict.fromkeys((k, label) for p in pts for k in ("weights", "kv_cache", "output")
                                 for label in p["printed"].get(k) or {}))
    rows = [[*flags, *(f"{b} compute (B)" for b in bufts), *(f"{k} {label} (printed)" for k, label in printed),
             "total (B)", "breakdown", "consistent", "trace", "dominant families"]]
    for p in pts:
        fams = ", ".join(f"{f['family']} {fmt_bytes(f['bytes'])}" for f in p["families"][:3])
        rows.append([*(p["values"][f] for f in flags), *(exact_count(p["buffers"].get(b)) for b in bufts),
                     *(_mib((p["printed"].get(k) or {}).get(label)) for k, label in printed),
                     exact_count(p.get("total")), _agrees(p.get("check")),
                     "-" if p["consistent"] is None else ("yes" if p["consistent"] else "NO"), p["trace"] or "-",
                     p["error"] if p["error"] and not p["trace"] else fams])
    lines = [f"sweep {out['sweep']}: {len(pts)} points"] + ["  " + line for line in text_table(rows)]
    for p in pts:
        if p["error"] and p["trace"]:
            lines.append(f"  {' '.join(f'{k}={v}' for k, v in p['values'].items())}: {p['error']}")
        lines += retried_line(" ".join(f"{k}={v}" for k, v in p["values"].items()), p.get("retried"))
        if p.get("check") and not p["check"]["agrees"]:
            from alloctrace.traces.preflight.breakdown import check_lines

            lines.append(f"  {' '.join(f'{k}={v}' for k, v in p['values'].items())}: the total differs from the "
                         "program's own breakdown")
            lines += check_lines(p["check"], "    ")
    if out["laws"]:
        lines += ["", "GROWTH (bytes at the peak, by family)"] + law_lines(out["laws"])
    if out["dominance"]:
        lines += ["", "DOMINANT FAMILY"] + dominance_lines(out["dominance"])
    if out["neighbours"]:
        lines += ["", "BETWEEN NEIGHBOURS (size attribution, as diff computes it)"]
        for n in out["neighbours"]:
            setting = " ".join(f"{k}={v}" for k, v in n["setting"].items())
            why = ", ".join(f"{f['family']} {'+' if f['delta'] >= 0 else '-'}{fmt_bytes(abs(f['delta']))}"
                            for f in n["families"])
            lines.append(f"  {n['axis']} {n['a']} -> {n['b']}{(' ' + setting) if setting else ''}: "
                         f"{n['delta']:+,} B ({why or 'no family moved'}; diff {n['a_trace']} {n['b_trace']})")
    from .fit import ignored_line

    ignored = sorted({f for p in pts for f in p.get("ignored") or ()})
    lines += [""] + ignored_line(ignored) if ignored else []
    same = [f for f in flags if f in ignored or f.lstrip("-") in {g.lstrip("-") for g in ignored}]
    if same:
        lines.append(f"  so the points along {', '.join(same)} are the same run: this build ignores the flag")
    lines += ["", f"stored as {len(pts)} traces tagged sweep={out['sweep']}; in the dashboard: /sweep?id={out['sweep']}"]
    return lines


def _mib(v) -> str:
    return "-" if v is None else f"{v:.2f} MiB"


def _agrees(c) -> str:
    """The point's total against the program's own breakdown: agrees, DIFFERS, or - (none printed)."""
    return "-" if not c else ("agrees" if c["agrees"] else "DIFFERS")


class _progress:
    """A rich progress bar on stderr while points run (on a terminal); elsewhere one line per recorded point."""

    def __init__(self, what: str = "replaying points"):
        self.what = what

    def __enter__(self):
        self.bar = None
        if sys.stderr.isatty():
            from rich.progress import Progress

            self.bar = Progress(transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=None)
        return self.advance

    def advance(self, done: int, total: int, point=None):
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total)
        elif point is not None:
            values = " ".join(f"{k}={v}" for k, v in point.values.items())
            size = ", ".join(f"{b} {n:,} B" for b, n in point.buffers.items()) or point.error or "no buffer"
            again = f" (run again: {point.retried})" if point.retried else ""
            print(safe(f"[{done}/{total}] {values}: {size}{again}"), file=sys.stderr, flush=True)

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
