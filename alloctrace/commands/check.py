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

import argparse
import json

from alloctrace.allocator.profiles import DEFAULT_PROFILE, names as profile_names
from alloctrace.traces.errors import UserError
from alloctrace.traces.util.sizes import fmt_bytes
from alloctrace.traces.util.textsafe import safe, safe_lines

from ._common import examples

EXIT_HAZARDS = 4
MEMORY_SHARE = 0.75  # of MemAvailable, when no --max-memory is given: leave the rest to other programs


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
        from alloctrace.traces.replay.run import preset_plans
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
    from alloctrace.traces.replay.run import preset_plans
    from alloctrace.traces.store.store import open_store

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


# --- memory ----------------------------------------------------------------------------------
def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _memory_limit(args) -> tuple[int | None, str]:
    """(bytes a numeric run may allocate, how that limit was chosen)."""
    if args.max_memory:
        return args.max_memory, "--max-memory"
    avail = _mem_available()
    if avail is None:
        return None, ""
    return int(avail * MEMORY_SHARE), f"{int(MEMORY_SHARE * 100)}% of MemAvailable {fmt_bytes(avail)}; --max-memory sets another"


def _reduced(hp: dict, div: int) -> dict:
    """The preset's shape at 1/div of its heads, widths and vocabulary, two layers at most; heads keep
    their width, so every head count still divides the embedding."""
    out = dict(hp)
    if "n_layer" in out:
        out["n_layer"] = min(int(out["n_layer"]), 2)
    if "n_head" in out and "n_embd" in out:
        head_dim = int(out["n_embd"]) // int(out["n_head"])
        out["n_head"] = max(1, int(out["n_head"]) // div)
        out["n_embd"] = head_dim * out["n_head"]
        if "n_head_kv" in out:
            kv = max(1, int(out["n_head_kv"]) // div)
            out["n_head_kv"] = kv if out["n_head"] % kv == 0 else 1
    for k in ("n_ff", "n_vocab"):
        if k in out:
            out[k] = max(8, int(out[k]) // div)
    return out


def _smaller(args, limit: int) -> str:
    """A reduced-dimension variant of the preset that fits in limit, as --hparam flags to paste."""
    from alloctrace.allocator.presets import PRESETS
    from alloctrace.metal_exec.execute import estimate_bytes
    from alloctrace.traces.replay.run import preset_plans

    preset = PRESETS.get(args.preset or "")
    if preset is None:
        return "try a smaller graph (e.g. --preset gpt2-tiny)"
    base = {**vars(preset.hparams), **_hparams(args.hparam)}
    for div in (2, 4, 8, 16, 32, 64, 128):
        hp = _reduced(base, div)
        changed = {k: v for k, v in sorted(hp.items()) if str(v) != str(getattr(preset.hparams, k, None))}
        try:
            plans = preset_plans(args.preset, args.profile, metal_concurrency=args.metal_concurrency,
                                 serial=args.serial, hparams={k: str(v) for k, v in changed.items()})
        except (ValueError, TypeError):
            continue
        need = max(map(estimate_bytes, plans))
        if need <= limit:
            flags = " ".join(f"--hparam {k}={v}" for k, v in changed.items())
            return f"a reduced {args.preset} fits: {flags} (about {fmt_bytes(need)})"
    return "try a smaller preset (e.g. --preset gpt2-tiny)"


def _refuse_if_too_big(args, plans):
    """Refuse before allocating anything when the numeric run would not fit in memory."""
    from alloctrace.metal_exec.execute import estimate_bytes

    limit, why = _memory_limit(args)
    need = max(map(estimate_bytes, plans), default=0)
    if limit is not None and need > limit:
        raise UserError(f"--numeric would allocate about {fmt_bytes(need)} ({need:,} bytes), more than the "
                        f"{fmt_bytes(limit)} allowed ({why}); {_smaller(args, limit)}")


def _numeric(plan, args):
    """The numeric run, with a progress bar on stderr (only drawn on a terminal)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from alloctrace.metal_exec.execute import run as execute

    columns = (TextColumn("numeric run, graph {task.fields[graph]}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=2 * len(plan.graph.nodes), graph=plan.graph_index)
        return execute(plan, order=args.order, seed=args.seed, on_node=lambda: bar.advance(task))


# --- the command ------------------------------------------------------------------------------
def _mode(plan) -> str:
    if plan.concurrent:
        return f"{len(plan.levels)} concurrent levels"
    return "serial"


def run(args) -> int:
    from alloctrace.metal_exec.execute import describe
    from alloctrace.metal_exec.hazards import check, summary
    from alloctrace.metal_exec.kernels import UnsupportedOp

    if args.max_memory and not args.numeric:
        raise UserError("--max-memory limits the numeric run: add --numeric")
    plans = _plans(args)
    if args.numeric:
        _refuse_if_too_big(args, plans)
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
            print(safe_lines("  " + line for line in summary(hazards).splitlines()))
        if args.numeric:
            try:
                result = _numeric(plan, args)
            except UnsupportedOp as e:
                raise UserError(f"numeric run: {e}") from None
            print(safe(f"  numeric ({args.order}): {describe(result)}"))
            if not result.ok:
                found += 1
    return EXIT_HAZARDS if found else 0
