"""`alloctrace state`: a PyTorch snapshot's allocator state at any entry (segments, blocks, fragmentation)."""
from __future__ import annotations

import json

from alloctrace.traces.errors import UserError

from ._common import add_store_arg, examples, open_store_from, table


EXAMPLES = examples(
    'alloctrace state 3c9e01aa --event oom --store ./store   # the allocator when the OOM struck',
    'alloctrace state 3c9e01aa:1 --event 4999 --top 5 --store ./store   # device 1, after entry 4999')


def register(subparsers):
    p = subparsers.add_parser("state", help="a PyTorch snapshot's allocator state at an entry (or at its OOM)",
                              description="Segments and blocks after entry N (entries 0..N applied, the numbering "
                                          "peak, flame and the OOM card use), rebuilt from the trace: reserved, allocated, reserved - allocated, the largest free "
                                          "block per pool, and the most fragmented segments. --event oom also "
                                          "prints the OOM card.")
    p.add_argument("ref", metavar="ID[:DEVICE]", help="trace id (a unique prefix is enough), device 0 by default")
    p.add_argument("--event", default="end", metavar="N|start|peak|oom|end",
                   help="after entry N (0-based, as peak and flame number entries), the start (before entry 0), the "
                        "requested-bytes peak, just before the first OOM, or the end (default)")
    add_store_arg(p)
    p.add_argument("--top", type=int, default=15, help="segments listed (most free bytes first)")
    p.add_argument("--json", action="store_true", help="print JSON (every segment and block)")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def run(args) -> int:
    from alloctrace.traces.state.torch_device import StateIndex, load_device, state
    from alloctrace.traces.explain.torch_peak import oom_card

    from alloctrace.traces.store.kinds import TORCH, require_kind

    store = open_store_from(args)
    tid, g = require_kind(store, args.ref, TORCH, "allocator state of ggml graphs is in the dashboard and the API")
    dev = load_device(store, tid, 0 if g is None else g)
    index = StateIndex(dev)
    card = None
    if args.event == "oom":
        card = oom_card(dev, index)
        if card is None:
            raise UserError(f"trace {tid} device {dev.device} has no OOM")
        k = card["event"]
    elif args.event == "peak":
        k = int(dev.extra.get("peak_requested_event") or 0) + 1
    elif args.event == "end":
        k = dev.n
    elif args.event == "start":
        k = 0
    elif args.event.isdecimal() and int(args.event) < dev.n:
        k = int(args.event) + 1
    else:
        raise UserError(f"--event: expected an entry 0..{dev.n - 1}, start, peak, oom or end, not {args.event!r}")
    st = state(dev, index, k)
    if args.json:
        print(json.dumps({**st, "oom": card}, indent=1))
        return 0
    t = st["totals"]
    nxt = st["next"]
    if st.get("partial"):
        print(f"note: {st['partial']}")
    where = (f"after entry {st['after_entry']:,}" if st["after_entry"] is not None else "at the start")
    if card:
        where += f", just before the OOM at entry {card['event']:,}"
    print(f"{where} (entries 0..{dev.n - 1:,})" + (f"; next: entry {nxt['i']:,}, {nxt['action']} {nxt['size']:,} B, "
                                                     f"{nxt['site']}" if nxt else ""))
    if t is None:
        held = st["held_since_start"]
        print(f"reserved, allocated and free blocks: unknown: {st['unknown']}")
        print(f"held by allocations the trace made: {held['bytes']:,} B in {held['allocations']:,} allocations")
    else:
        print(f"reserved {t['reserved']:,}  allocated {t['allocated']:,}  requested {t['requested']:,}  "
              f"reserved - allocated {t['cached']:,}  pending free {t['pending_free']:,}")
        print(f"largest free block: large pool {t['largest_free']['large']:,}, "
              f"small pool {t['largest_free']['small']:,}; {t['segments']:,} segments")
    if card:
        print("\n".join(oom_lines(card)))
    rows = [["SEGMENT", "POOL", "SIZE", "ALLOCATED", "FREE", "LARGEST FREE", "BLOCKS"]]
    segs = sorted(st["segments"], key=lambda s: -sum(b["size"] for b in s["blocks"] if b["state"] == "free"))
    for s in segs[:max(args.top, 0)]:
        free = [b["size"] for b in s["blocks"] if b["state"] == "free"]
        rows.append([f"{s['address']:#x}", s["pool"], f"{s['size']:,}", f"{s['size'] - sum(free):,}",
                     f"{sum(free):,}", f"{max(free, default=0):,}", str(len(s["blocks"]))])
    print(table(rows))
    if card:
        print("WHO HELD THE MEMORY")
        print(table([["BYTES", "SHARE", "COUNT", "CALL SITE"]] +
                    [[f"{g['bytes']:,}", f"{g['share'] * 100:.1f}%", str(g["count"]), g["site"]]
                     for g in card["holders"]]))
    return 0


def oom_lines(card: dict) -> list[str]:
    """The OOM card as text: the request, the cause (a cap or the GPU), the retries, the largest blocks."""
    out = [f"OOM at entry {card['event']:,} (of {card['n_ooms']:,}): requested {card['requested']:,} B "
           f"(a {card['segment_needed']:,} B segment) from {card['site']}",
           f"  cause: {card['cause']['text']}"]
    if card.get("unknown"):
        out.append(f"  reserved, allocated and free blocks at the OOM: unknown: {card['unknown']}")
    elif card["device_free"] is not None:
        out.append(f"  device free at the OOM: {card['device_free']:,} B; reserved {card['reserved']:,} B, "
                   f"allocated {card['allocated']:,} B, cached {card['cached']:,} B")
    if card.get("cap"):
        c = card["cap"]
        out.append(f"  memory cap: {c['lower']:,} - {c['upper'] - 1:,} B ({c.get('source', 'inferred')})"
                   + (f", roundest {c['roundest']:,} B" if c.get("roundest") is not None else ""))
    if card.get("largest_free") and not card.get("unknown"):
        out.append(f"  largest free block: large pool {card['largest_free']['large']:,} B, "
                   f"small pool {card['largest_free']['small']:,} B")
    if card.get("retries") is not None:
        out.append(f"  retries (the cache released and the request tried again, whole run): {card['retries']:,}")
    for r in card["cache_releases"][-1:]:
        out.append(f"  before it the cache was emptied: {r['segments']} segments ({r['bytes']:,} B) at entries "
                   f"{r['first']:,}-{r['end'] - 1:,}, then {r['then']}")
    if card["largest_blocks"]:
        out.append("  largest blocks held: " + "; ".join(f"{b['bytes']:,} B from {b['site']} (entry {b['entry']:,})"
                                                       for b in card["largest_blocks"][:5]))
    return out
