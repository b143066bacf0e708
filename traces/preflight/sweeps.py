"""A recorded sweep as one object: its points, growth laws, who dominates where, and the size attribution
between neighbouring points (as `diff` computes it). Built right after a sweep runs, or again from the
store by the sweep's id (the `sweep=<id>` tag) for the dashboard.
"""
from __future__ import annotations

from .ignored import ignored
from .laws import dominance, laws, numeric_flags
from .points import Point
from .summary import summarise

MAX_NEIGHBOURS = 64
TOP_DELTAS = 3


def sweep_json(store, sweep_id: str, varies: list, points: list[Point]) -> dict:
    dicts = [{**p.to_json(), "families_all": p.all_families, "_peak": p.peak} for p in points]
    out = {"sweep": sweep_id, "vary": varies, "points": [p.to_json() for p in points],
           "laws": laws(dicts), "dominance": dominance(dicts), "neighbours": neighbours(store, dicts),
           "ignored": ignored(dicts, points[0].argv if points else [], [f for f, _ in varies])}
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
    """Recorded sweeps in the store, newest first: {"sweep", "points", "name", "created", "stopped"} (stopped: the
    signal that stopped the sweep before all its points ran, else None)."""
    found: dict[str, dict] = {}
    for s in store.list():
        for tag in s.get("tags") or ():
            if isinstance(tag, str) and tag.startswith("sweep="):
                sid = tag[len("sweep="):]
                program = s["name"].split(" -")[0]  # "PROGRAM -c=512 -fa=on": the program
                entry = found.setdefault(sid, {"sweep": sid, "points": 0, "name": program, "created": s["created"],
                                               "stopped": None})
                entry["points"] += 1
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
                  trace=s["id"], status=meta.get("status"), no_gpu=bool(meta.get("no_gpu")))
        summarise(store, p, s["id"])
        pts.append((int(meta.get("index", 0)), p))
    pts.sort(key=lambda kp: kp[0])
    out = sweep_json(store, sweep_id, varies or [], [p for _, p in pts])
    out["stopped"] = next((stopped_by(s.get("tags")) for s in members if stopped_by(s.get("tags"))), None)
    return out


def stopped_by(tags) -> str | None:
    """The signal a `sweep-stopped=SIGNAL` tag names (the sweep was stopped before all its points ran)."""
    for t in tags or ():
        if isinstance(t, str) and t.startswith("sweep-stopped="):
            return t.partition("=")[2]
    return None
