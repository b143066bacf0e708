"""`alloctrace peak`: what was live at a trace's peak, grouped by call site."""
from __future__ import annotations

import json

from alloctrace.errors import UserError

from ._common import add_store_arg, open_store_from, table


def register(subparsers):
    p = subparsers.add_parser("peak", help="the live allocations at a trace's peak, by call site",
                              description="The peak of requested bytes and the allocations live at it, grouped "
                                          "by their first frame outside torch (PyTorch snapshots).")
    p.add_argument("id", metavar="ID", help="trace id (a unique prefix is enough)")
    add_store_arg(p)
    p.add_argument("--device", type=int, default=None, help="only this device (default: all)")
    p.add_argument("--skip", metavar="PARTS", default=None,
                   help="comma-separated file-name parts of frames that are not call sites "
                        "(default: torch's own files)")
    p.add_argument("--top", type=int, default=20, help="call sites listed (the rest are summed up)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    store = open_store_from(args)
    summary = store.summary(args.id)
    if summary["source"] != "torch":
        raise UserError(f"trace {summary['id']}: peak attribution needs a PyTorch snapshot (source "
                        f"{summary['source']!r})")
    from alloctrace.traces.torch.views import DEFAULT_SKIP, load_device, peak

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
