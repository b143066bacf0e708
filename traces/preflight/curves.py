"""A pre-flight result as curves against the varied knob: what the dashboard's /preflight page draws.

Three stored results have one: a recorded sweep (`sweep --vary`, tag `sweep=<id>`), a fit (`fit`, its answer's
trace carries every probe in `extra.fit`) and a PyTorch search (`plan --vary`, tag `plan=<id>`, its points in
`extra.plan_vary`). Each becomes one curve per buffer: for ggml, every compute buffer (exact bytes) and every
size the program printed, by kind and label (`{kind: {label: MiB}}`: a KV cache per device, an iSWA cache's
own labels, whatever was printed), and their total; for PyTorch, every category at the peak and the reserved
and allocated peaks. A printed size is rounded: it carries its uncertainty (half its last printed digit).
Where a straight line a + b·x holds for every point of a curve (within each point's uncertainty), the law is
given and evaluated between the points tried: those are the predicted points, told apart from the run ones.
"""
from __future__ import annotations

from fractions import Fraction

from .printed import MEMORY_KINDS, MIB, bytes_of, total_mib

PRINTED_KINDS = {"weights": "weights", "kv_cache": "KV cache", "output": "output buffer",
                 "recurrent_state": "recurrent state"}
MAX_POINTS = 512       # points read from a stored sweep
PREDICTED = 16         # law points spread over the range searched
MAX_BANDS = 32         # points a line through rounded sizes' uncertainty bands is searched for


def load(store, pid: str, budget: int | None = None) -> dict:
    """The curves of the stored pre-flight result `pid` (a sweep's or fit's id, or a plan's); `budget`
    (bytes) draws another budget than the stored one and answers for it from the points that ran."""
    from alloctrace.traces.store.store import NotFound

    ggml = store.list(tags=[f"sweep={pid}"])
    if ggml:
        return _ggml(store, pid, ggml[:MAX_POINTS], budget)
    plans = store.list(tags=[f"plan={pid}"])
    if plans:  # a trace per point tried: the answer's first (each holds the whole search)
        kept = [store.meta(s["id"]).extra.get("plan_vary") or {} for s in plans]
        order = sorted(range(len(plans)), key=lambda i: (kept[i].get("stored_value") != kept[i].get("value"),
                                                         kept[i].get("stored_value") or 0))
        out = _plan(store, pid, plans[order[0]], budget)
        out["traces"] = [plans[i]["id"] for i in order]
        return out
    raise NotFound(f"no stored sweep, fit or plan {pid!r} in this store")


def listed(store) -> list[dict]:
    """Every stored pre-flight result, newest first: {"id", "kind", "name", "points", "created"}."""
    from .sweeps import sweep_ids

    out = []
    for s in store.list():
        for tag in s.get("tags") or ():
            if isinstance(tag, str) and tag.startswith("plan="):
                out.append({"id": tag[5:], "kind": "plan", "name": s["name"], "points": None, "created": s["created"]})
    for s in sweep_ids(store):
        out.append({"id": s["sweep"], "kind": "fit" if s.get("fit") else "sweep", "name": s["name"],
                    "points": s["points"], "created": s["created"]})
    return sorted(out, key=lambda x: x["created"] or "", reverse=True)


def printed_uncertainty(values: list[float]) -> int:
    """Half the last printed digit, in bytes: llama.cpp prints MiB to two decimals, its memory breakdown in
    whole MiB (a curve whose every value is whole may be either, so the wider is taken)."""
    whole = all(float(v).is_integer() for v in values)
    return int(round((0.5 if whole else 0.005) * MIB))


def _ggml(store, pid: str, members: list[dict], budget: int | None) -> dict:
    from .summary import buffer_sizes

    rows = []
    fit = None
    for s in members:
        extra = store.meta(s["id"]).extra
        meta = extra.get("sweep") or {}
        fit = fit or extra.get("fit")
        buffers: dict[str, int] = {}
        for g in store.summary(s["id"])["graphs"]:
            for buft, size in buffer_sizes(store.graph_extra(s["id"], g["index"]), g).items():
                buffers[buft] = max(buffers.get(buft, 0), size)
        rows.append({"values": dict(meta.get("values") or {}), "buffers": buffers,
                     "printed": meta.get("printed") or {}, "trace": s["id"], "index": int(meta.get("index", 0))})
    rows.sort(key=lambda r: r["index"])
    if fit:  # the probes hold every run of the search; the stored answer is one of them
        axis, compute_only = fit["flag"], bool(fit["compute_only"])
        traced = {r["values"].get(axis): r["trace"] for r in rows}
        rows = [{"values": {axis: str(p["value"])}, "buffers": p["buffers"], "printed": p["printed"],
                 "trace": traced.get(str(p["value"]))} for p in sorted(fit["probes"], key=lambda p: p["value"])]
        span = (fit["lo"], fit["hi"], fit["step"])
        budget_stored = fit["budget"]
    else:
        axis, compute_only, span, budget_stored = _axis(rows), False, None, None
    budget = budget if budget is not None else budget_stored
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if axis is None or not str(r["values"].get(axis, "")).isdecimal():
            continue
        setting = " ".join(f"{k}={v}" for k, v in r["values"].items() if k != axis)
        groups.setdefault(setting, []).append(r)
    curves, answers = [], []
    for setting, rs in groups.items():
        drawn = curves_of(rs, axis, setting, compute_only, span)
        curves += drawn
        if budget is not None:
            lo, step = (span[0], span[2]) if span else (drawn[-1]["points"][0]["x"], 1)
            answers.append(_answer_of(drawn[-1], setting, budget,
                                      {"value": fit["value"]} if fit and budget == fit["budget"] else None, lo, step))
    return {"id": pid, "kind": "fit" if fit else "sweep", "axis": axis, "budget": budget, "stored_budget": budget_stored,
            "range": list(span[:2]) if span else None, "compute_only": compute_only, "curves": curves,
            "answers": answers, "traces": sorted({r["trace"] for r in rows if r["trace"]})}


def curves_of(rows: list[dict], axis: str, setting: str = "", compute_only: bool = False, span=None) -> list[dict]:
    """One setting's curves, the total last. rows: {"values": {flag: value}, "buffers": {buffer type: bytes},
    "printed": printed_sizes(), "trace"}; span: (LOW, HIGH, STEP) searched, else the values that ran."""
    rs = sorted(rows, key=lambda r: int(r["values"][axis]))
    xs = [int(r["values"][axis]) for r in rs]
    lo, hi, step = span or (xs[0], xs[-1], 1)
    named: list[dict] = []
    for buft in dict.fromkeys(b for r in rs for b in r["buffers"]):
        named.append(_curve(f"{buft} compute buffer", "compute", setting,
                            [(x, r["buffers"].get(buft), 0, r["trace"]) for x, r in zip(xs, rs)]))
    if not compute_only:  # every kind the budget counts, each label as printed (the breakdown is a check, not memory)
        for kind in MEMORY_KINDS:
            words = PRINTED_KINDS.get(kind, kind.replace("_", " "))
            for label in dict.fromkeys(lb for r in rs for lb in (r["printed"].get(kind) or {})):
                mibs = [(r["printed"].get(kind) or {}).get(label) for r in rs]
                unc = printed_uncertainty([m for m in mibs if m is not None])
                named.append(_curve(f"{label} {words}", kind, setting,
                                    [(x, None if m is None else bytes_of(m), unc, r["trace"])
                                     for x, m, r in zip(xs, mibs, rs)]))
    total = _total(named, setting, rs, xs, compute_only)
    for c in [*named, total]:
        _with_law(c, axis, lo, hi, step)
    return [*named, total]


def _axis(rows: list[dict]) -> str | None:
    """The first varied flag that takes more than one whole-number value."""
    flags = list(rows[0]["values"]) if rows else []
    for f in flags:
        vals = {r["values"].get(f) for r in rows}
        if len(vals) > 1 and all(str(v).isdecimal() for v in vals):
            return f
    return flags[0] if flags else None


def _curve(name: str, kind: str, setting: str, pts: list[tuple]) -> dict:
    """pts: (x, bytes or None, uncertainty bytes, trace) for each point that ran."""
    return {"name": name + (f" ({setting})" if setting else ""), "kind": kind, "setting": setting,
            "points": [{"x": x, "bytes": int(b), "uncertainty_bytes": u, "measured": True, "trace": t}
                       for x, b, u, t in pts if b is not None]}


def _total(named: list[dict], setting: str, rows: list[dict], xs: list[int], compute_only: bool) -> dict:
    """Each point's total as `fit` counts it (its exact compute buffers plus the printed sizes `total_mib` sums),
    its uncertainty the sum of those printed sizes' own."""
    counted = {"compute", *(() if compute_only else MEMORY_KINDS)}
    pts = []
    for x, r in zip(xs, rows):
        size = sum(r["buffers"].values()) + (0 if compute_only else bytes_of(total_mib(r["printed"])))
        unc = sum(p["uncertainty_bytes"] for c in named if c["kind"] in counted for p in c["points"] if p["x"] == x)
        pts.append((x, size, unc, r["trace"]))
    return _curve("total", "total", setting, pts)


def _with_law(curve: dict, axis: str, lo: int, hi: int, step: int = 1) -> None:
    """The least-squares line a + b·x through the curve's points (exact for exact sizes), kept when every point
    lies on it within its uncertainty; its values between lo and hi (on the step grid) where nothing ran are
    the predicted points. A point that ran out of memory (a plan's) counts only the part before: left out."""
    pts = [p for p in curve["points"] if not p.get("oom")]
    curve["law"], curve["predicted"] = None, []
    xs, ys = [Fraction(p["x"]) for p in pts], [Fraction(p["bytes"]) for p in pts]
    n = len(pts)
    if len(set(xs)) < 2:
        return
    sx, sy = sum(xs), sum(ys)
    b = (n * sum(x * y for x, y in zip(xs, ys)) - sx * sy) / (n * sum(x * x for x in xs) - sx * sx)
    a = (sy - b * sx) / n
    if not _holds(a, b, pts):
        line = _line_within(pts)
        if line is None:
            return
        a, b = line
    _set_law(curve, a, b, axis, lo, hi, step, "exact" if all(p["uncertainty_bytes"] == 0 for p in pts)
             else "within the printed rounding")


def _set_law(curve: dict, a, b, axis: str, lo: int, hi: int, step: int, how: str) -> None:
    """The law a + b·x on the curve, and its predicted points on the grid between lo and hi where nothing ran."""
    a, b = Fraction(a), Fraction(b)
    if not b:
        formula = f"{_text(a)} B (constant)"
    else:
        formula = (f"{_text(a)} {'-' if b < 0 else '+'} " if a else "-" if b < 0 else "") + f"{_text(abs(b))}·{axis} B"
    curve["law"] = {"intercept": _num(a), "slope": _num(b), "formula": formula, "exact": how == "exact", "holds": how}
    ran = {p["x"] for p in curve["points"]}
    grid = sorted({lo + ((hi - lo) * k // PREDICTED) // step * step for k in range(PREDICTED + 1)} | {hi})
    unc = max((p["uncertainty_bytes"] for p in curve["points"]), default=0)
    curve["predicted"] = [{"x": x, "bytes": round(a + b * x), "uncertainty_bytes": unc, "measured": False}
                          for x in grid if x not in ran and lo <= x <= hi]


def _holds(a, b, pts) -> bool:
    return all(abs(a + b * p["x"] - p["bytes"]) <= p["uncertainty_bytes"] for p in pts)


def _line_within(pts: list[dict]):
    """A line through every point's uncertainty band, when the least-squares one misses a band (rounded sizes
    whose errors fall unevenly): if one exists, one passes through two bands' edges, so those are tried."""
    if len(pts) > MAX_BANDS or not any(p["uncertainty_bytes"] for p in pts):
        return None
    for i, p in enumerate(pts):
        for q in pts[i + 1:]:
            if p["x"] == q["x"]:
                continue
            for du in (-1, 1):
                for dv in (-1, 1):
                    y0, y1 = p["bytes"] + du * p["uncertainty_bytes"], q["bytes"] + dv * q["uncertainty_bytes"]
                    b = Fraction(y1 - y0, q["x"] - p["x"])
                    a = y0 - b * p["x"]
                    if _holds(a, b, pts):
                        return a, b
    return None


def _answer_of(total: dict, setting: str, budget: int, stored=None, lo: int = 0, step: int = 1) -> dict:
    """The largest value whose total fits: `stored` ({"value": ...}, what the search answered for its own
    budget), else the largest point that ran to its end under the budget; and, where the total has a law, the
    largest value the law predicts within the range searched."""
    ran = [p for p in total["points"] if p["bytes"] <= budget and not p.get("oom")]
    best = stored["value"] if stored is not None else (max(p["x"] for p in ran) if ran else None)
    at = next((p for p in total["points"] if p["x"] == best), None)
    out = {"setting": setting, "value": best, "bytes": at["bytes"] if at else None, "law_value": None}
    law = total.get("law")
    if law and law["slope"] > 0:
        xs = [p["x"] for p in total["points"]] + [p["x"] for p in total["predicted"]]
        limit = int((Fraction(budget) - Fraction(law["intercept"])) / Fraction(law["slope"]))
        if min(xs) <= limit:
            out["law_value"] = min(lo + (limit - lo) // step * step, max(xs))
    return out


def _plan(store, pid: str, s: dict, budget: int | None) -> dict:
    kept = store.meta(s["id"]).extra.get("plan_vary") or {}
    axis, points = kept.get("name"), sorted(kept.get("points") or [], key=lambda p: p["value"])
    lo, hi = kept.get("lo") or points[0]["value"], kept.get("hi") or points[-1]["value"]
    budget = budget if budget is not None else kept.get("budget")

    def curve(name, kind, of, spread=None):
        c = {"name": name, "kind": kind, "setting": "",
             "points": [{"x": p["value"], "bytes": int(of(p)), "uncertainty_bytes": 0, "measured": True,
                         "oom": p["oom"] is not None, "trace": s["id"] if p["value"] == kept.get("stored_value")
                         else None, **({"range": list(p[spread])} if spread and p.get(spread) else {})}
                        for p in points]}
        _with_law(c, axis, lo, hi)
        law = (kept.get("laws") or {}).get(name) if kind == "category" else None
        if c["law"] is None and law and law.get("linear"):  # `plan`'s own law per category: within 1 %
            _set_law(c, law["a"], law["b_per_unit"], axis, lo, hi, 1, "within 1% at every point that ran")
        return c

    cats = list(dict.fromkeys(c for p in points for c in p["categories"]))
    curves = [curve(c, "category", lambda p, c=c: p["categories"].get(c, 0)) for c in cats]
    # a point's range: its peak over every order the driver may place segments in (torch_plan.ADDRESS_ORDERS)
    curves.append(curve("reserved (max_memory_reserved)", "reserved", lambda p: p["peak_reserved"],
                        "peak_reserved_range"))
    curves.append(curve("allocated (max_memory_allocated)", "allocated", lambda p: p["peak_allocated"],
                        "peak_allocated_range"))
    stored = {"value": kept.get("value")} if budget == kept.get("budget") else None
    answer = _answer_of(curves[-2], "", budget, stored) if budget is not None else None
    if answer and stored is not None and kept.get("address_orders"):
        answer["value_every_order"] = kept.get("value_every_order")  # the answer wherever segments land
        answer["address_orders"] = kept["address_orders"]
    return {"id": pid, "kind": "plan", "axis": axis, "budget": budget, "stored_budget": kept.get("budget"),
            "range": [lo, hi], "compute_only": False, "curves": curves, "answers": [answer] if answer else [],
            "traces": [s["id"]], "name": s["name"]}


def _num(f: Fraction):
    return int(f) if f.denominator == 1 else float(f)


def _text(f: Fraction) -> str:
    """A law's coefficient as read: whole bytes exactly, else to two decimals."""
    return f"{int(f):,}" if f.denominator == 1 else f"{float(f):,.2f}"
