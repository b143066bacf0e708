"""`alloctrace peak REF`: what is live at a graph's high-water mark, by family, and the holes below it;
for a PyTorch snapshot, the live allocations at its peak by call site."""
from __future__ import annotations

import json

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.textsafe import safe_lines

from ._common import add_store_arg, examples, open_store_from


EXAMPLES = examples(
    "alloctrace peak 59b3150c:0 --store ./store   # what sets graph 0's size",
    'alloctrace peak run.log:1 --tensors   # a log file, imported on the fly; every live tensor',
    'alloctrace peak 3c9e01aa --top 10 --store ./store   # a PyTorch snapshot: by call site',
    'alloctrace peak 7d2e4f10 --ranks --store ./store   # the ranks of a job side by side')


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
                            "(default: torch's own files; 'default,PART' adds to them). C++ frames are never "
                            "call sites while a stack has a Python frame")
    torch.add_argument("--top", type=int, default=20, help="call sites listed (the rest are summed up)")
    torch.add_argument("--ranks", action="store_true",
                       help="compare the devices (ranks) of a trace: peak, reserved, fragmentation, the OOM, and "
                            "what differed between the rank that ran out (or peaked highest) and the lowest")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.explain.peak import peak_json
    from alloctrace.traces.store.kinds import TORCH, kind_of_source

    from .diff import names_a_file, resolve_ref

    store = open_store_from(args, create=names_a_file(args.ref))
    ref = resolve_ref(store, args.ref, {})
    summary = store.summary(ref)
    if kind_of_source(summary["source"]) == TORCH:
        return ranks_peak(args, store, summary) if args.ranks else torch_peak(args, store, summary)
    if args.ranks:
        raise UserError("--ranks compares the ranks of a PyTorch trace; this is a ggml trace")
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
               f"{pk.get('label') or pk['tensor'] or '(unnamed)'}"]
        shaped = any(f.get("shape") for f in body["families"])
        rows = [["family", "tensors", "bytes", "exact", "share", "first node", "last node"]
                + (["largest tensor: type [ne] and its bytes"] if shaped else [])]
        for f in body["families"]:
            rows.append([f["family"], str(f["tensors"]), fmt_bytes(f["bytes"]), f"{f['bytes']:,}",
                         f"{f['share']:.1%}", f["first_node"] or "(unnamed)", f["last_node"] or "(unnamed)"]
                        + ([_shape_text(f.get("shape"))] if shaped else []))
        out += ["  " + line for line in text_table(rows)]
        out.append(f"  fragmentation: {fmt_bytes(fr['free_below_peak'])} ({fr['free_below_peak']:,} B) free below "
                   f"the high-water mark, largest hole {fmt_bytes(fr['largest_hole'])} ({fr['largest_hole']:,} B)")
        acc = body.get("accounting")
        if acc:
            out.append("  " + accounting_text(acc))
        for h in fr.get("holes") or ():
            what = ", ".join(f"{x.get('label') or _display(x)} ({x['bytes']:,} B, freed at event "
                             f"{x['freed_at']})" for x in h["freed"])
            none = h.get("unattributed") or 0
            if not what:
                what = f"by no logged tensor: {none:,} B unattributed"
            elif none:
                what += f"; {none:,} B of it by no logged tensor (unattributed)"
            out.append(f"    hole at {h['offset']:,}: {fmt_bytes(h['bytes'])} ({h['bytes']:,} B), held {what}")
        return out

    lines = [f"trace {p['trace']} graph {p['graph']} ({p.get('role') or '?'}), {p['n_events']:,} events"]
    if p.get("uncertainty_bytes"):
        lines.append(f"  sizes exact up to {p['uncertainty_bytes']:,} bytes: {p.get('reason') or '?'}")
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
        rows += [[t.get("label") or _display(t), t["family"], f"{t['bytes']:,}", f"{t['offset']:,}", str(t["chunk"]),
                  str(t["start"]), str(t["end"])] for t in p["tensors"]]
        lines += ["", "LIVE TENSORS"] + ["  " + line for line in text_table(rows)]
    return lines


def _display(t: dict) -> str:
    """A tensor's name, numbered where its graph has several tensors of that name (`node_7 #2`)."""
    from alloctrace.traces.explain.peak_types import display_name

    return display_name(t["tensor"], t.get("occurrence")) or "(unnamed)"


def accounting_text(acc: dict) -> str:
    """Where every byte below the mark is: live tensors (padding among them, where shapes say), free after
    earlier tensors, and bytes no logged tensor held."""
    pad = ""
    if acc.get("padding_known_for"):
        pad = f" ({acc['padding_bytes']:,} B of it allocator padding, from the shapes of {acc['padding_known_for']:,} tensors)"
    return (f"accounted: {acc['tensor_bytes']:,} B in {acc['tensors']:,} live tensors{pad} + {acc['freed_bytes']:,} B "
            f"free after earlier tensors + {acc['unattributed_bytes']:,} B unattributed = {acc['bytes']:,} B")


def _shape_text(shape: dict | None) -> str:
    if not shape:
        return "-"
    if shape.get("formula"):
        return shape["formula"]
    return f"{shape['type']} [{', '.join(map(str, shape['ne']))}]"


def torch_peak(args, store, summary: dict) -> int:
    """A snapshot's peak per device: the live allocations grouped by their first frame outside torch."""
    from alloctrace.traces.state.torch_frames import parse_skip
    from alloctrace.traces.state.torch_device import StateIndex, load_device
    from alloctrace.traces.explain.torch_peak import oom_card, peak

    from ._common import table

    skip = parse_skip(args.skip)
    devices = [g["index"] for g in summary["graphs"] if args.device is None or g["index"] == args.device]
    if not devices:
        raise UserError(f"trace {summary['id']} has no device {args.device}")
    peaks = []
    for d in devices:
        dev = load_device(store, summary["id"], d)
        p = peak(dev, skip, max(args.top, 1))
        p["oom"] = oom_card(dev, StateIndex(dev), skip)
        peaks.append(p)
    if args.json:
        print(json.dumps({"id": summary["id"], "name": summary["name"], "source": "torch", "devices": peaks},
                         indent=1))
        return 0
    for p in peaks:
        print(f"device {p['device']}: peak requested {p['peak_requested']:,} B at entry {p['event']}, "
              f"peak reserved {p['peak_reserved']:,} B, {p['live_allocations']:,} live allocations")
        if p.get("partial"):
            print(f"note: {p['partial']}")
        rows = [["BYTES", "SHARE", "COUNT", "CALL SITE"]]
        rows += [[f"{g['bytes']:,}", f"{g['share'] * 100:.1f}%", str(g["count"]), g["site"]]
                 for g in p["by_call_site"]]
        print(table(rows))
        if p.get("oom"):
            from .state import oom_lines
            print("\n".join(oom_lines(p["oom"])))
    return 0


def ranks_peak(args, store, summary: dict) -> int:
    """`peak --ranks`: the ranks side by side, then the call sites whose bytes at the peak differ most."""
    from alloctrace.traces.state.torch_frames import parse_skip
    from alloctrace.traces.diff.torch_ranks import compare

    from ._common import table

    skip = parse_skip(args.skip)
    c = compare(store, summary["id"], skip, max(args.top, 1))
    if args.json:
        print(json.dumps(c, indent=1))
        return 0
    rows = [["RANK", "DEVICE", "ENTRIES", "PEAK REQUESTED", "PEAK RESERVED", "FRAGMENTATION", "OOM"]]
    for r in c["ranks"]:
        oom = r["oom"]
        rows.append([str(r["rank"]), f"{r['device']} (cuda:{r['cuda_device']})", f"{r['n_events']:,}",
                     f"{r['peak_requested']:,}", f"{r['peak_reserved']:,}",
                     f"{r['fragmentation']:,} ({r['fragmentation_share']:.1%})",
                     "-" if not oom else f"entry {oom['event']}: {oom['requested']:,} requested"])
    print(f"trace {c['id']} {c['name']}: {len(c['ranks'])} ranks"
          + (f"; out of memory: rank {', '.join(map(str, c['oom_ranks']))}" if c["oom_ranks"] else ""))
    print(table(rows))
    d = c["compared"]
    if d:
        print(f"rank {d['b_rank']} ({d['why']}) against rank {d['a_rank']}: peak requested {d['delta_requested']:+,}, "
              f"peak reserved {d['delta_reserved']:+,}; {d['paired']:,} allocations paired"
              f"{' (same call-site sequence)' if d['same_sequence'] else ''}, {d['only_a']:,} only in rank "
              f"{d['a_rank']}, {d['only_b']:,} only in rank {d['b_rank']}, {d['grew']:,} grew, {d['shrank']:,} shrank")
        rows = [[f"RANK {d['a_rank']}", f"RANK {d['b_rank']}", "DELTA", "CALL SITE"]]
        rows += [[f"{r['a_bytes']:,}", f"{r['b_bytes']:,}", f"{r['delta']:+,}", r["site"]] for r in d["by_call_site"]]
        print(table(rows))
    return 0
