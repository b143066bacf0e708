"""A recorded sweep as one object: its points, growth laws, who dominates where, and the size attribution
between neighbouring points (as `diff` computes it). Built right after a sweep runs, or again from the
store by the sweep's id (the `sweep=<id>` tag) for the dashboard.
"""
from __future__ import annotations

from .breakdown import check
from .laws import dominance, laws, numeric_flags
from .points import Point
from .summary import summarise

MAX_NEIGHBOURS = 64
TOP_DELTAS = 3


def sweep_json(store, sweep_id: str, varies: list, points: list[Point]) -> dict:
    dicts = [{**p.to_json(), "families_all": p.all_families, "_peak": p.peak} for p in points]
    out = {"sweep": sweep_id, "vary": varies, "points": [point_json(p) for p in points],
           "laws": laws(dicts), "dominance": dominance(dicts), "neighbours": neighbours(store, dicts),
           "ignored": sorted({f for p in points for f in p.ignored})}  # flags the program said it ignores
    return out


def point_json(p: Point) -> dict:
    """A point with its total (exact compute + every printed weight, KV cache, output and recurrent state
    buffer) and that total checked against the program's own breakdown (breakdown.py)."""
    from .printed import bytes_of, total_mib

    out = p.to_json()
    out["total"] = p.total + bytes_of(total_mib(p.printed)) if p.buffers else None
    out["check"] = check(p.buffers, p.printed) if p.buffers else None
    return out


def neighbours(store, points: list[dict]) -> list[dict]:
    """Consecutive points along the first numeric flag (the others equal): b - a by family, exactly."""
    from alloctrace.traces.explain.peak_types import size_attribution

    ok = [p for p in points if p.get("trace") and p.get("graph") is not None]
    flags = numeric_flags(ok)
    if not flags:
        return []
    axis = flags[0]
    groups: dict[tuple, list[dict]] = {}
    for p in ok:
        groups.setdefault(tuple((k, v) for k, v in p["values"].items() if k != axis), []).append(p)
    cache: dict = {}

    def peak(p):
        if p.get("_peak") is not None:  # computed when the point was summarised
            return p["_peak"]
        key = (p["trace"], p["graph"])
        if key not in cache:
            from alloctrace.traces.explain.peak import graph_peak

            cache[key] = graph_peak(store, *key)[0]
        return cache[key]

    out = []
    for key, ps in groups.items():
        ps.sort(key=lambda p: int(p["values"][axis]))
        for a, b in zip(ps, ps[1:]):
            if len(out) >= MAX_NEIGHBOURS:
                return out
            att = size_attribution(peak(a), peak(b))
            out.append({"axis": axis, "setting": dict(key), "a": a["values"][axis], "b": b["values"][axis],
                        "a_trace": a["trace"], "b_trace": b["trace"], "a_graph": a["graph"], "b_graph": b["graph"],
                        "delta": att["delta"], "fragmentation_delta": att["fragmentation_delta"],
                        "families": [f for f in att["families"] if f["delta"]][:TOP_DELTAS]})
    return out


def sweep_ids(store) -> list[dict]:
    """Recorded sweeps in the store, newest first: {"sweep", "points", "name", "created", "stopped", "fit"} (stopped:
    the signal that stopped the sweep before all its points ran, else None; fit: the flag, when a fit stored it)."""
    found: dict[str, dict] = {}
    for s in store.list():
        for tag in s.get("tags") or ():
            if isinstance(tag, str) and tag.startswith("sweep="):
                sid = tag[len("sweep="):]
                program = s["name"].split(" -")[0]  # "PROGRAM -c=512 -fa=on": the program
                entry = found.setdefault(sid, {"sweep": sid, "points": 0, "name": program, "created": s["created"],
                                               "stopped": None})
                entry["points"] += 1
                fit = next((t[4:] for t in s.get("tags") or () if isinstance(t, str) and t.startswith("fit=")), None)
                entry["fit"] = entry.get("fit") or fit  # a fit's answer: its page is /preflight, not a sweep
                entry["stopped"] = entry["stopped"] or stopped_by(s.get("tags"))
    return list(found.values())


def load(store, sweep_id: str) -> dict:
    """The sweep object of a recorded sweep, from its traces."""
    members = [s for s in store.list() if f"sweep={sweep_id}" in (s.get("tags") or ())]
    if not members:
        from alloctrace.traces.store.store import NotFound

        raise NotFound(f"no recorded sweep {sweep_id!r} in this store")
    pts: list[tuple[int, Point]] = []
    varies = None
    for s in members:
        meta = store.meta(s["id"]).extra.get("sweep") or {}
        varies = varies or meta.get("vary")
        p = Point(dict(meta.get("values") or {}), list(meta.get("argv") or []), printed=meta.get("printed") or {},
                  trace=s["id"], ignored=list(meta.get("ignored") or []), retried=meta.get("retried"))
        summarise(store, p, s["id"])
        pts.append((int(meta.get("index", 0)), p))
    pts.sort(key=lambda kp: kp[0])
    out = sweep_json(store, sweep_id, varies or [], [p for _, p in pts])
    out["stopped"] = next((stopped_by(s.get("tags")) for s in members if stopped_by(s.get("tags"))), None)
    out["fit"] = next((t[4:] for s in members for t in s.get("tags") or () if isinstance(t, str)
                       and t.startswith("fit=")), None)  # a fit's answer: the pre-flight page draws its search
    return out


def stopped_by(tags) -> str | None:
    """The signal a `sweep-stopped=SIGNAL` tag names (the sweep was stopped before all its points ran)."""
    for t in tags or ():
        if isinstance(t, str) and t.startswith("sweep-stopped="):
            return t.partition("=")[2]
    return None
