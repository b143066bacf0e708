"""`alloctrace whatif`: replay a PyTorch snapshot under other caching-allocator settings."""
from __future__ import annotations

import json

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.sizes import fmt_bytes

from ._common import add_store_arg, examples, open_store_from


EXAMPLES = examples(
    'alloctrace whatif 3c9e01aa --set expandable_segments=true --store ./store',
    'alloctrace whatif snapshot.pickle.gz --cap 6GiB   # a file, imported on the fly',
    'alloctrace whatif 3c9e01aa --set max_split_size_mb=128 --set garbage_collection_threshold=0.8 --json --store ./store')


def register(subparsers):
    p = subparsers.add_parser(
        "whatif", help="PyTorch snapshot: peak memory and OOMs under other caching-allocator settings",
        description="Replay a PyTorch memory snapshot's allocation requests through a model of the CUDA caching "
                    "allocator, first as recorded (checked against every recorded decision), then under the "
                    "settings given here, and compare peak reserved, peak allocated, fragmentation and OOMs.")
    p.add_argument("trace", metavar="ID", help="stored torch trace id (ID or ID:DEVICE), or a snapshot "
                   ".pickle[.gz|.zst] file (FILE or FILE:DEVICE), imported into the store on the fly")
    p.add_argument("--device", type=int, default=None, help="CUDA device of the trace (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="allocator setting (repeatable): expandable_segments=true, max_split_size_mb=64, "
                        "roundup_power2_divisions=4, garbage_collection_threshold=0.8, release_cached_on_oom=false")
    p.add_argument("--cap", metavar="SIZE", help="memory cap of the what-if run: a size (6GiB or 6G: 6 x 2**30 bytes; 6GB: 6 x 10**9), or "
                   "set_per_process_memory_fraction as fraction:0.5 or 50%% of the GPU's memory; 'none' for no cap")
    p.add_argument("--recorded-cap", metavar="SIZE",
                   help="the cap the recorded run had (a snapshot does not record it; default: inferred from its "
                        "OOMs, none if it had none)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    add_store_arg(p)
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def check_settings(args) -> None:
    """Bad settings fail before anything is imported."""
    from alloctrace.traces.whatif.torch_model import AllocatorSettings
    from alloctrace.traces.whatif.torch_request import apply_overrides, parse_pairs, parse_size

    try:
        apply_overrides(AllocatorSettings(), parse_pairs(args.settings), args.cap)
        if args.recorded_cap:
            parse_size(args.recorded_cap)
    except ValueError as e:
        raise UserError(str(e)) from None


def load_device(args) -> tuple[str, int, dict, dict]:
    """(trace id, device, columns, info) of the trace's device; a snapshot file is imported first (as `diff`
    does with files), then read back from the store like any stored trace."""
    from alloctrace.traces.store.torch_stored import device_columns, device_info

    from .diff import names_a_file, resolve_ref

    store = open_store_from(args, create=names_a_file(args.trace))
    ref = resolve_ref(store, args.trace, {})
    tid, sep, dev = ref.partition(":")
    if sep and not dev.isdecimal():
        raise UserError(f"{args.trace}: the device after ':' is a number")
    device = int(dev) if sep else 0
    if args.device is not None:
        if sep and args.device != device:
            raise UserError(f"{args.trace} names device {device} but --device says {args.device}")
        device = args.device
    return tid, device, device_columns(store, tid, device), device_info(store, tid, device)


def compare(cols: dict, info: dict, settings: list[str], cap: str | None, recorded_cap: str | None,
            *, keep_series: bool = False, progress=None) -> dict:
    from alloctrace.traces.whatif.torch_request import whatif_request

    try:
        return whatif_request(cols, info, settings, cap, recorded_cap, keep_series=keep_series, progress=progress)
    except ValueError as e:
        raise UserError(str(e)) from None


def run(args) -> int:
    check_settings(args)
    tid, device, cols, info = load_device(args)
    n = len(cols["action"])
    if n > 200_000:
        from rich.console import Console
        from rich.progress import Progress
        with Progress(console=Console(stderr=True), transient=True) as prog:
            tasks = {}

            def tick(phase, done, total):
                if phase not in tasks:
                    tasks[phase] = prog.add_task(f"replaying ({phase} settings)", total=total)
                prog.update(tasks[phase], completed=done)
            out = compare(cols, info, args.settings, args.cap, args.recorded_cap, progress=tick)
    else:
        out = compare(cols, info, args.settings, args.cap, args.recorded_cap)
    out.update(trace_id=tid, device=device)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(text(out))
    return 0


def _oom(o) -> str:
    return "none" if not o else f"at entry {o['event']} ({fmt_bytes(o['size'])} requested)"


def text(out: dict) -> str:
    real, wi, s = out["real"], out["whatif"], out["settings"]
    changed = {k: v for k, v in s.items() if out["recorded_settings"].get(k) != v}

    def show(k, v):
        if k in ("max_split_size", "memory_limit") and v is not None:
            return f"{k}={fmt_bytes(v)}"
        return f"{k}={v}"
    lines = [f"trace {out['trace_id']} device {out['device']}"]
    if out.get("partial"):
        lines.append(f"note: {out['partial']['note']} ({out['partial']['seed_reserved']:,} B reserved at entry 0)")
    lines += [f"note: {n}" for n in out.get("notes", [])]
    lines += [f"what if: {', '.join(show(k, v) for k, v in changed.items()) or 'the recorded settings'}",
              f"  replay of the recorded run: {'consistent' if real['consistent'] else 'NOT consistent'}"]
    if real.get("mismatch"):
        m = real["mismatch"]
        lines.append(f"    first mismatch at entry {m['event']}: trace {m['expected']}, model {m['model']}")
    rows = [("", "real", "what-if"),
            ("peak reserved", fmt_bytes(real["peak_reserved"]), fmt_bytes(wi["peak_reserved"])),
            ("peak allocated", fmt_bytes(real["peak_allocated"]), fmt_bytes(wi["peak_allocated"])),
            ("fragmentation at peak", fmt_bytes(real["fragmentation_at_peak"]), fmt_bytes(wi["fragmentation_at_peak"])),
            ("OOM", _oom(real["oom"]), _oom(wi["oom"]))]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines += [f"  {a.ljust(w0)}  {b.ljust(w1)}  {c}" for a, b, c in rows]
    if wi.get("avoided_ooms"):
        lines.append(f"  the what-if run survives the recorded OOM at entry {wi['avoided_ooms'][0]} (what the program "
                     "did after it is not in the trace)")
    if wi.get("stopped_at") is not None:
        lines.append(f"  the what-if run stops at entry {wi['stopped_at']}: the program would have failed there")
    return "\n".join(lines)
