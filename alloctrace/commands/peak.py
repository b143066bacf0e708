"""`alloctrace peak REF`: what is live at a graph's high-water mark, by family, and the holes below it;
for a PyTorch snapshot, the live allocations at its peak by call site."""
from __future__ import annotations

import json

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe_lines

from ._common import add_store_arg, open_store_from


def register(subparsers):
    p = subparsers.add_parser(
        "peak", help="what is live at a graph's high-water mark, grouped by tensor family",
        description="Find the allocation that sets a graph's high-water mark and list the tensors live there, "
                    "grouped by family (name without layer index and ggml's suffixes; the op when unnamed), with "
                    "bytes and share of the buffer, and the free bytes below the mark (fragmentation).")
    p.add_argument("ref", metavar="REF", help="ID:GRAPH (ID alone: its first graph), or a log file (FILE[:GRAPH])")
    add_store_arg(p)
    p.add_argument("--json", action="store_true", help="print the peak as JSON")
    p.add_argument("--tensors", action="store_true", help="also list every tensor live at the peak")
    torch = p.add_argument_group("PyTorch snapshots")
    torch.add_argument("--device", type=int, default=None, help="only this device (default: all)")
    torch.add_argument("--skip", metavar="PARTS", default=None,
                       help="comma-separated file-name parts of frames that are not call sites "
                            "(default: torch's own files)")
    torch.add_argument("--top", type=int, default=20, help="call sites listed (the rest are summed up)")
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.explain.peak import peak_json
    from alloctrace.traces.store.kinds import TORCH, kind_of_source

    from .diff import resolve_ref

    store = open_store_from(args)
    ref = resolve_ref(store, args.ref, {})
    summary = store.summary(ref)
    if kind_of_source(summary["source"]) == TORCH:
        return torch_peak(args, store, summary)
    out = peak_json(store, ref)
    if args.json:
        if not args.tensors:
            out.pop("tensors", None)
        print(json.dumps(out, indent=1))
    else:
        print(safe_lines(report_lines(out, args.tensors)))  # tensor names are data: escaped
    return 0


def report_lines(p: dict, tensors: bool = False) -> list[str]:
    from alloctrace.traces.explain.peak import text_table
    from alloctrace.traces.util.sizes import fmt_bytes

    def section(title: str, body: dict) -> list[str]:
        pk, fr = body["peak"], body["fragmentation"]
        out = [f"{title}: {fmt_bytes(pk['bytes'])} ({pk['bytes']:,} B), set at event {pk['event']} by "
               f"{pk['tensor'] or '(unnamed)'}"]
        rows = [["family", "tensors", "bytes", "exact", "share", "first node", "last node"]]
        for f in body["families"]:
            rows.append([f["family"], str(f["tensors"]), fmt_bytes(f["bytes"]), f"{f['bytes']:,}",
                         f"{f['share']:.1%}", f["first_node"] or "(unnamed)", f["last_node"] or "(unnamed)"])
        out += ["  " + line for line in text_table(rows)]
        out.append(f"  fragmentation: {fmt_bytes(fr['free_below_peak'])} ({fr['free_below_peak']:,} B) free below "
                   f"the high-water mark, largest hole {fmt_bytes(fr['largest_hole'])} ({fr['largest_hole']:,} B)")
        return out

    lines = [f"trace {p['trace']} graph {p['graph']} ({p.get('role') or '?'}), {p['n_events']:,} events"]
    if p["peak"]["event"] is None:
        return lines + ["  nothing was allocated"]
    lines += section("peak", p)
    for b in p.get("buffers") or []:
        head = f"chunk {b['chunk']}"
        if b.get("buffer") is not None:
            head = f"buffer {b['buffer']} ({b.get('name') or '?'}) {head}"
        lines += [""] + section(head, b)
    fail = p.get("failure")
    if fail:
        cap = f" of the {fmt_bytes(fail['capacity'])} buffer" if fail.get("capacity") else ""
        lines += ["", f"OUT OF SPACE at event {fail['event']}: {fail['tensor'] or '(unnamed)'} needed "
                      f"{fmt_bytes(fail['needed'])} ({(fail['needed'] or 0):,} B); {fmt_bytes(fail['free'])} "
                      f"({fail['free']:,} B) free{cap}, largest hole {fmt_bytes(fail['largest_hole'])} "
                      f"({fail['largest_hole']:,} B)",
                  "  live then: " + ", ".join(f"{f['family']} {fmt_bytes(f['bytes'])}" for f in fail["families"][:8])]
    if tensors and p.get("tensors"):
        rows = [["tensor", "family", "bytes", "offset", "chunk", "placed", "freed"]]
        rows += [[t["tensor"] or "(unnamed)", t["family"], f"{t['bytes']:,}", f"{t['offset']:,}", str(t["chunk"]),
                  str(t["start"]), str(t["end"])] for t in p["tensors"]]
        lines += ["", "LIVE TENSORS"] + ["  " + line for line in text_table(rows)]
    return lines


def torch_peak(args, store, summary: dict) -> int:
    """A snapshot's peak per device: the live allocations grouped by their first frame outside torch."""
    from alloctrace.traces.state.torch_device import DEFAULT_SKIP, load_device
    from alloctrace.traces.explain.torch_peak import peak

    from ._common import table

    skip = DEFAULT_SKIP if args.skip is None else tuple(p for p in args.skip.split(",") if p)
    devices = [g["index"] for g in summary["graphs"] if args.device is None or g["index"] == args.device]
    if not devices:
        raise UserError(f"trace {summary['id']} has no device {args.device}")
    peaks = [peak(load_device(store, summary["id"], d), skip, max(args.top, 1)) for d in devices]
    if args.json:
        print(json.dumps({"id": summary["id"], "name": summary["name"], "source": "torch", "devices": peaks},
                         indent=1))
        return 0
    for p in peaks:
        print(f"device {p['device']}: peak requested {p['peak_requested']:,} B at entry {p['event']}, "
              f"peak reserved {p['peak_reserved']:,} B, {p['live_allocations']:,} live allocations")
        rows = [["BYTES", "SHARE", "COUNT", "CALL SITE"]]
        rows += [[f"{g['bytes']:,}", f"{g['share'] * 100:.1f}%", str(g["count"]), g["site"]]
                 for g in p["by_call_site"]]
        print(table(rows))
    return 0
