"""Diff two snapshots (batch 8 vs 16, checkpointing on vs off): where the peak moved, exactly.

Three answers, each adding up exactly:
- the peak by call site side by side: Σ per-site deltas = Δ peak requested bytes;
- the delta through aligned allocations: allocations live at both peaks (resized) + live only at B's
  peak − live only at A's peak = Δ peak;
- Δ peak reserved = Δ peak requested + Δ cache overhead (reserved − requested at each side's peak).
Allocations are aligned by their full stack and occurrence number (the k-th allocation from a stack in A
pairs with the k-th from the same stack in B): the common case, the same call-site sequence with other
sizes, pairs everything, in order.
"""
from __future__ import annotations

import numpy as np

from alloctrace.traces.state.torch_device import DEFAULT_SKIP, Device, live_at

from alloctrace.traces.explain.torch_peak import peak


def _keys(dev: Device, skip) -> list:
    """Per alloc row: its full stack as text (entries without frames: their label)."""
    al = dev.allocations()
    cache: dict[int, tuple] = {}
    out = []
    for stack, start in zip(al.stack.tolist(), al.start.tolist()):
        if stack < 0:
            out.append(("", dev.label(stack, start, skip)))
            continue
        k = cache.get(stack)
        if k is None:
            k = cache[stack] = tuple(f"{f['filename']}:{f['line']}:{f['name']}" for f in dev.frames(stack))
        out.append(k)
    return out


def _occurrences(ids: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions hold the same id."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_ids)) + 1]
    group_start = np.repeat(first, np.diff(np.r_[first, len(ids)]))
    occ = np.empty(len(ids), dtype=np.int64)
    occ[order] = np.arange(len(ids)) - group_start
    return occ


def align(a: Device, b: Device, skip=DEFAULT_SKIP) -> dict:
    """Pair A's and B's allocations (rows of .allocations()) by stack and occurrence."""
    ka, kb = _keys(a, skip), _keys(b, skip)
    ids: dict = {}
    ia = np.array([ids.setdefault(k, len(ids)) for k in ka], dtype=np.int64)
    ib = np.array([ids.setdefault(k, len(ids)) for k in kb], dtype=np.int64)
    width = int(max(len(ia), len(ib))) + 1
    ca = ia * width + _occurrences(ia) if len(ia) else ia
    cb = ib * width + _occurrences(ib) if len(ib) else ib
    _, ra, rb = np.intersect1d(ca, cb, assume_unique=True, return_indices=True)
    by_a = np.argsort(ra, kind="stable")
    ra, rb = ra[by_a], rb[by_a]
    same_sequence = len(ia) == len(ib) and bool(np.array_equal(ia, ib))
    first_div = None
    if not same_sequence:
        m = min(len(ia), len(ib))
        diff = np.flatnonzero(ia[:m] != ib[:m])
        first_div = int(diff[0]) if len(diff) else m
    return {"a_rows": ra, "b_rows": rb, "same_sequence": same_sequence, "in_order": bool(np.all(np.diff(rb) > 0)),
            "first_divergence": first_div, "n_a": len(ia), "n_b": len(ib)}


def diff(a: Device, b: Device, skip=DEFAULT_SKIP, top: int = 40, max_points: int = 600) -> dict:
    pa, pb = peak(a, skip, top=1 << 30), peak(b, skip, top=1 << 30)
    sa = {g["site"]: g for g in pa["by_call_site"]}
    sb = {g["site"]: g for g in pb["by_call_site"]}
    rows = []
    for site in set(sa) | set(sb):
        ga, gb = sa.get(site, {}), sb.get(site, {})
        rows.append({"site": site, "a_bytes": ga.get("bytes", 0), "b_bytes": gb.get("bytes", 0),
                     "delta": gb.get("bytes", 0) - ga.get("bytes", 0), "a_count": ga.get("count", 0),
                     "b_count": gb.get("count", 0)})
    rows.sort(key=lambda r: (-abs(r["delta"]), -r["b_bytes"], r["site"]))
    if len(rows) > top:
        rest = rows[top:]
        label = f"({len(rest)} other call site{'s' if len(rest) > 1 else ''})"
        rows = rows[:top] + [{"site": label,
                              **{k: sum(r[k] for r in rest) for k in ("a_bytes", "b_bytes", "delta", "a_count",
                                                                      "b_count")}}]
    al = align(a, b, skip)
    parts = _decompose(a, b, pa["event"], pb["event"], al, skip)
    d_req = pb["peak_requested"] - pa["peak_requested"]
    req_a, res_a = a.curves()
    req_b, res_b = b.curves()
    overhead_a = int(res_a[pa["event"]] - req_a[pa["event"]]) if a.n else 0
    overhead_b = int(res_b[pb["event"]] - req_b[pb["event"]]) if b.n else 0
    return {
        "a": _side(a, pa), "b": _side(b, pb),
        "delta_requested": d_req,
        "by_call_site": rows,
        "decomposition": parts,
        "reserved": {"delta_peak_reserved": pb["peak_reserved"] - pa["peak_reserved"],
                     "delta_requested_peak": d_req,
                     "reserved_at_requested_peak": {"a": int(res_a[pa["event"]]) if a.n else 0,
                                                    "b": int(res_b[pb["event"]]) if b.n else 0},
                     "cache_overhead_at_peak": {"a": overhead_a, "b": overhead_b}},
        "alignment": _alignment_summary(a, b, al, max_points),
    }


def _side(dev: Device, p: dict) -> dict:
    return {"trace_id": dev.trace_id, "name": dev.name, "device": dev.device, "n_events": dev.n,
            "peak_requested": p["peak_requested"], "peak_reserved": p["peak_reserved"], "peak_event": p["event"]}


def _decompose(a: Device, b: Device, ka: int, kb: int, al: dict, skip) -> dict:
    """Δ peak = resized (paired, live at both peaks) + only_b (live at B's peak only) − only_a
    (+ the change in bytes allocated before either trace began, 0 for complete traces)."""
    live_a, live_b = live_at(a, ka), live_at(b, kb)
    in_a = np.zeros(len(a.allocations().start), dtype=bool)
    in_a[live_a] = True
    in_b = np.zeros(len(b.allocations().start), dtype=bool)
    in_b[live_b] = True
    ra, rb = al["a_rows"], al["b_rows"]
    both = in_a[ra] & in_b[rb]
    both_a, both_b = ra[both], rb[both]
    only_a = np.setdiff1d(live_a, both_a)
    only_b = np.setdiff1d(live_b, both_b)
    za, zb = a.allocations().size, b.allocations().size
    resized = int(zb[both_b].sum() - za[both_a].sum())
    plus, minus = int(zb[only_b].sum()), int(za[only_a].sum())
    # live bytes neither trace saw allocated (a trace that wrapped or began late): the rest of each peak
    pre_a = int(a.curves()[0][ka]) - int(za[live_a].sum()) if a.n else 0
    pre_b = int(b.curves()[0][kb]) - int(zb[live_b].sum()) if b.n else 0
    return {"resized": {"bytes": resized, "count": int(both.sum()),
                        "changed": int((zb[both_b] != za[both_a]).sum())},
            "only_b": {"bytes": plus, "count": len(only_b), "top_sites": _top_sites(b, only_b, skip)},
            "only_a": {"bytes": minus, "count": len(only_a), "top_sites": _top_sites(a, only_a, skip)},
            "before_trace": {"a": pre_a, "b": pre_b, "bytes": pre_b - pre_a},
            "total": resized + plus - minus + pre_b - pre_a}


def _top_sites(dev: Device, rows: np.ndarray, skip, n: int = 5) -> list[dict]:
    al = dev.allocations()
    acc: dict[str, int] = {}
    for stack, start, size in zip(al.stack[rows].tolist(), al.start[rows].tolist(), al.size[rows].tolist()):
        site = dev.label(stack, start, skip)
        acc[site] = acc.get(site, 0) + size
    return [{"site": s, "bytes": v} for s, v in sorted(acc.items(), key=lambda kv: -kv[1])[:n]]


def _alignment_summary(a: Device, b: Device, al: dict, max_points: int) -> dict:
    """Counts, and A's and B's sizes along the aligned sequence (summed per bucket, so payloads stay small)."""
    ra, rb = al["a_rows"], al["b_rows"]
    za, zb = a.allocations().size[ra], b.allocations().size[rb]
    n = len(ra)
    out = {k: al[k] for k in ("same_sequence", "in_order", "first_divergence", "n_a", "n_b")}
    out.update({"paired": n, "only_a": al["n_a"] - n, "only_b": al["n_b"] - n,
                "same_size": int((za == zb).sum()), "grew": int((zb > za).sum()), "shrank": int((zb < za).sum())})
    if n:
        edges = np.unique(np.linspace(0, n, min(n, max_points) + 1).astype(np.int64))
        out["sequence"] = {"index": edges[:-1].tolist(), "a_bytes": np.add.reduceat(za, edges[:-1]).tolist(),
                           "b_bytes": np.add.reduceat(zb, edges[:-1]).tolist()}
        ratio = zb[za > 0] / za[za > 0]
        out["size_ratio"] = {"median": float(np.median(ratio)) if len(ratio) else None,
                             "min": float(ratio.min()) if len(ratio) else None,
                             "max": float(ratio.max()) if len(ratio) else None}
    return out


def first_difference(a: Device, b: Device, al: dict, skip=DEFAULT_SKIP) -> dict | None:
    """The first allocation where the runs part: the first position whose full stack differs, else the first
    aligned pair whose size differs; None when both allocated the same sizes from the same sites in order."""
    za, zb = a.allocations(), b.allocations()
    k = al["first_divergence"]
    if k is None:
        changed = np.flatnonzero(za.size[al["a_rows"]] != zb.size[al["b_rows"]])
        if not len(changed):
            return None
        ia, ib, why = int(al["a_rows"][changed[0]]), int(al["b_rows"][changed[0]]), "size"
    else:
        ia, ib, why = k, k, "stack"  # the full stacks differ (the labels may still read alike)

    def one(dev, rows, i):
        if i >= len(rows.size):
            return None
        return {"index": i, "size": int(rows.size[i]), "site": dev.label(int(rows.stack[i]), int(rows.start[i]), skip)}
    return {"differs_in": why, "a": one(a, za, ia), "b": one(b, zb, ib)}


def diff_stored(store, ref_a: str, ref_b: str, skip=DEFAULT_SKIP, top: int = 40) -> dict:
    """The diff of two stored PyTorch snapshots ("ID" or "ID:DEVICE"), for every diff entry point: the
    peak by call site, the decomposition, the alignment and the first allocation that differs."""
    from alloctrace.traces.state.torch_device import load_device
    from alloctrace.traces.store.kinds import TORCH, require_same_kind

    require_same_kind(store, ref_a, ref_b, TORCH)
    devs = []
    for ref in (ref_a, ref_b):
        tid, g = store.resolve(ref)
        devs.append(load_device(store, tid, 0 if g is None else g))
    d = diff(*devs, skip=skip, top=top)
    d["kind"] = TORCH
    d["first_difference"] = first_difference(*devs, align(*devs, skip), skip)
    return d
