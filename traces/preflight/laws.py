"""Growth laws: how each family's bytes at the peak follow from the varied numeric flags, and who dominates where.

A family's law comes from its largest tensor's shape first: each dimension of `ne` that is the same at every
point is a number, one that equals a varied flag's value at every point is that flag; with the bytes per
element (bytes / elements, the type's size for f32 / f16) the law is exact by construction and checked against
every point's bytes ("kq: 4·(-c)·512·8 B per tensor"). Without shapes, or when a dimension follows no flag,
the bytes themselves are fitted exactly: c·x^a·y^b (a, b in 0..2), then a + b·x; else no law is claimed.

A program clamps: llama.cpp's n_ubatch is min(-ub, -c), its KV cells are -c padded to 256, a sliding-window
cache has min(padded -c, window + n_ubatch) cells. A dimension is `min(FLAG, K)` only where the points show the
cap, `pad(FLAG, P)` where they show the padding; where no one law holds along a flag, consecutive points are
split into pieces that each have one (`piecewise`: the law changes between two points, a clamp lies there).
Every law says the range it was fitted on (`fitted_on`) and holds only there: nothing here extrapolates.
"""
from __future__ import annotations

import re
from fractions import Fraction
from itertools import product

MAX_EXPONENT = 2
PADS = (32, 64, 128, 256, 512, 1024)  # paddings tried, smallest first
MIN_FITTED = 3  # points a fitted (not shape) piece of a piecewise law needs
LAYER = re.compile(r"-\d+$")  # llama.cpp names a layer's tensors NAME-IL


def numeric_flags(points: list[dict]) -> list[str]:
    """The varied flags whose values are whole numbers at every point, in the sweep's order."""
    if not points:
        return []
    flags = list(points[0]["values"])
    return [f for f in flags if all(str(p["values"].get(f, "")).isdecimal() for p in points)
            and len({p["values"][f] for p in points}) > 1]


def _family_rows(points: list[dict], family: str) -> list[tuple[dict, dict]]:
    return [(p, f) for p in points for f in p.get("families_all", p.get("families", ())) if f["family"] == family]


def shape_law(rows: list[tuple[dict, dict]], flags: list[str]) -> dict | None:
    """The per-tensor law from shapes, or None when a dimension follows no flag (or shapes are missing)."""
    if not rows or any("ne" not in f for _, f in rows):
        return None
    dims: list[str | int] = []
    for d in range(4):
        vals = [int(f["ne"][d]) for _, f in rows]
        if len(set(vals)) == 1:
            dims.append(vals[0])
            continue
        match = next((fl for fl in flags if all(int(p["values"][fl]) == v for (p, _), v in zip(rows, vals))), None)
        if match is None:  # a flag capped by a constant: llama.cpp's n_ubatch is min(-ub, -c)
            cap = max(vals)
            match = next(((fl, cap) for fl in flags
                          if all(min(int(p["values"][fl]), cap) == v for (p, _), v in zip(rows, vals))), None)
        if match is None:  # the smaller of two flags: llama.cpp's n_ubatch is min(-ub, -c)
            match = next((("min", a, b) for i, a in enumerate(flags) for b in flags[i + 1:]
                          if all(min(int(p["values"][a]), int(p["values"][b])) == v
                                 for (p, _), v in zip(rows, vals))), None)
        if match is None:  # a flag rounded up: llama.cpp pads -c to 256 cells
            match = next((("pad", fl, pad) for fl in flags for pad in PADS
                          if all(-(-int(p["values"][fl]) // pad) * pad == v for (p, _), v in zip(rows, vals))), None)
        if match is None:
            return None
        dims.append(match)
    elem = {Fraction(f["tensor_bytes"], max(1, _prod(f["ne"]))) for _, f in rows}
    if len(elem) != 1:
        return None  # padded beyond nbytes somewhere: the bytes fit below decides
    (size,) = elem
    for p, f in rows:  # exact at every point, by construction; checked all the same
        if size * _prod([_dim(x, p["values"]) for x in dims]) != f["tensor_bytes"]:
            return None
    factors = [str(_num(size))] + [_dim_text(x) for x in dims if x != 1]
    type_ = rows[0][1].get("type")
    tensors = {f["tensors"] for _, f in rows}
    return {"kind": "shape", "per": "tensor", "type": type_, "bytes_per_element": _num(size),
            "dims": [_dim_text(x) if not isinstance(x, int) else x for x in dims],
            "formula": "·".join(factors) + " B", "tensors_at_peak": sorted(tensors),
            "example": rows[0][1].get("label") or rows[0][1]["tensor"]}


def bytes_law(rows: list[tuple[dict, dict]], flags: list[str]) -> dict | None:
    """An exact fit of the family's bytes: c·Π x^e first (smallest exponents first), then a + b·x."""
    if len(rows) < 2 or not flags:
        return None
    xs = [[int(p["values"][fl]) for fl in flags] for p, _ in rows]
    ys = [f["bytes"] for _, f in rows]
    combos = sorted(product(range(MAX_EXPONENT + 1), repeat=len(flags)), key=lambda e: (sum(e), e))
    for exps in combos:
        cs = {Fraction(y, _prod([x ** e for x, e in zip(xv, exps)])) for xv, y in zip(xs, ys)}
        if len(cs) == 1:
            (c,) = cs
            factors = [str(_num(c))] + [fl if e == 1 else f"{fl}^{e}" for fl, e in zip(flags, exps) if e]
            if all(e == 0 for e in exps):
                return {"kind": "constant", "formula": f"{_num(c)} B", "coefficient": _num(c)}
            return {"kind": "product", "formula": "·".join(factors) + " B", "coefficient": _num(c),
                    "exponents": dict(zip(flags, exps))}
    for k, fl in enumerate(flags):
        others = {tuple(x for j, x in enumerate(xv) if j != k) for xv in xs}
        pts = sorted({(xv[k], y) for xv, y in zip(xs, ys)})
        if len(others) != 1 or len({x for x, _ in pts}) < 2:
            continue
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        b = Fraction(y1 - y0, x1 - x0)
        a = y0 - b * x0
        if all(a + b * x == y for x, y in pts):
            return {"kind": "affine", "formula": f"{_num(a)} + {_num(b)}·{fl} B", "intercept": _num(a),
                    "slope": _num(b), "flag": fl}
    return None


def laws(points: list[dict]) -> list[dict]:
    """One law per family seen at any point's peak, the largest families first."""
    ok = [p for p in points if not p.get("error") and p.get("families")]
    flags = numeric_flags(ok)
    biggest: dict[str, int] = {}
    for p in ok:
        for f in p.get("families_all", p["families"]):
            biggest[f["family"]] = max(biggest.get(f["family"], 0), f["bytes"])
    out = []
    others = [f for f in (list(ok[0]["values"]) if ok else []) if f not in flags]
    for fam in sorted(biggest, key=lambda k: (-biggest[k], k)):
        rows = _family_rows(ok, fam)
        law = _fit(rows, flags)
        by_setting = None
        if law is None and others:  # e.g. -fa on and off: one law per setting of the other flags
            by_setting = _by_setting(rows, others, flags)
        if law is None and by_setting is None and len(flags) > 1:  # along the first numeric flag, per -ub
            axis = flags[0]
            by_setting = _by_setting(rows, [k for k in rows[0][0]["values"] if k != axis], [axis])
        where = [p["values"] for p, _ in rows]
        out.append({"family": fam, "law": law, "by_setting": by_setting, "points": len(rows), "of": len(ok),
                    "largest": biggest[fam], "present_at": where if len(rows) < len(ok) else None})
    return out


def _by_setting(rows, keys: list[str], flags: list[str]) -> list[dict] | None:
    """One law per setting of `keys`, fitted along `flags`; None when no setting has one."""
    groups: dict[tuple, list] = {}
    for p, f in rows:
        groups.setdefault(tuple((k, p["values"][k]) for k in keys), []).append((p, f))
    out = [{"setting": dict(k), "law": _fit(g, flags), "points": len(g)} for k, g in groups.items()]
    return None if all(b["law"] is None for b in out) else out


def _fit(rows, flags) -> dict | None:
    law = shape_law(rows, flags) or bytes_law(rows, flags) or piecewise_law(rows, flags)
    if law is not None:
        law["fitted_on"] = fitted_on(rows, flags)
    return law


def fitted_on(rows, flags) -> dict:
    """{flag: [lowest, highest]} of the points a law was fitted on: the only range where it holds."""
    return {fl: [min(int(p["values"][fl]) for p, _ in rows), max(int(p["values"][fl]) for p, _ in rows)]
            for fl in flags}


def piecewise_law(rows, flags) -> dict | None:
    """Where no one law holds along a single varied flag: consecutive points split into pieces, each the longest
    run from its first point that one law fits (a fitted law on 3 points at least; a single point is its bytes
    there). The law changes between two pieces: a clamp lies there, so no piece extends beyond its points."""
    moving = [fl for fl in flags if len({p["values"][fl] for p, _ in rows}) > 1]
    if len(moving) != 1 or len(rows) < 3:
        return None
    (axis,) = moving
    rows = sorted(rows, key=lambda r: int(r[0]["values"][axis]))
    pieces, start = [], 0
    while start < len(rows):
        end, law = start + 1, None
        while end < len(rows):
            law_next = shape_law(rows[start:end + 1], [axis]) or bytes_law(rows[start:end + 1], [axis])
            if law_next is None:
                break
            law, end = law_next, end + 1
        if law is not None and law["kind"] in ("product", "affine") and end - start < MIN_FITTED:
            law, end = None, start + 1  # any line fits two points: not a law yet
        part = rows[start:end]
        if law is None:
            law = {"kind": "constant", "formula": f"{part[0][1]['bytes']} B at this point only"}
        law["fitted_on"] = fitted_on(part, [axis])
        pieces.append(law)
        start = end
    if len(pieces) > 3 or all(len(_points_of(x, axis)) == 1 for x in pieces):
        return None  # more pieces than clamps: no law, not a table of points
    text = "; ".join(f"{axis}={_span(x['fitted_on'][axis])}: {x['formula']}" for x in pieces)
    between = [[a["fitted_on"][axis][1], b["fitted_on"][axis][0]] for a, b in zip(pieces, pieces[1:])]
    changes = ", ".join(f"{a} and {b}" for a, b in between)
    return {"kind": "piecewise", "axis": axis, "pieces": pieces, "formula": text, "changes_between": between,
            "note": f"the law changes between {axis}={changes} (a clamp); each piece holds only on its own points"}


def _points_of(law, axis) -> list[int]:
    lo, hi = law["fitted_on"][axis]
    return [lo] if lo == hi else [lo, hi]


def _span(v) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]}..{v[1]}"


def dominance(points: list[dict]) -> list[dict]:
    """Which family is the largest at the peak, along the first numeric flag for each setting of the others."""
    ok = [p for p in points if not p.get("error") and p.get("families")]
    flags = numeric_flags(ok)
    axis = flags[0] if flags else None
    groups: dict[tuple, list[dict]] = {}
    for p in ok:
        key = tuple((k, v) for k, v in p["values"].items() if k != axis)
        groups.setdefault(key, []).append(p)
    out = []
    for key, ps in groups.items():
        if axis:
            ps = sorted(ps, key=lambda p: int(p["values"][axis]))
        runs: list[dict] = []
        for p in ps:
            top = p["families"][0]["family"]
            at = p["values"][axis] if axis else None
            if runs and runs[-1]["family"] == top:
                runs[-1]["to"] = at
            else:
                runs.append({"family": top, "from": at, "to": at})
        out.append({"setting": dict(key), "axis": axis, "runs": runs})
    return out


def law_text(law: dict | None) -> str:
    if law is None:
        return "no exact law in these points"
    if law["kind"] == "piecewise":
        return f"{law['formula']} ({law['note']})"
    return _one_law_text(law) + _range_text(law)


def _range_text(law: dict) -> str:
    """"  [fitted on -c=512..4096]": where the law was seen to hold, and only there."""
    spans = [f"{fl}={_span(v)}" for fl, v in (law.get("fitted_on") or {}).items()]
    return f"  [fitted on {', '.join(spans)}]" if spans else ""


def _one_law_text(law: dict) -> str:
    if law["kind"] == "shape":
        dims = ", ".join(str(d) for d in law["dims"])
        n = law["tensors_at_peak"]
        many = "" if n == [1] else f", {'/'.join(map(str, n))} such tensors live at the peak"
        per = "per layer" if LAYER.search(law["example"]) else "per tensor"  # kq-0: one such tensor per layer
        return f"{law['formula']} {per} ({law['example']}: {law['type']} [{dims}]{many})"
    return law["formula"]


def law_lines(ls: list[dict], top: int = 8) -> list[str]:
    out = []
    for x in ls[:top]:
        where = "" if x["present_at"] is None else f"  (at {x['points']} of {x['of']} points)"
        if x["law"] is None and x.get("by_setting"):
            out.append(f"  {x['family']}:{where}")
            for b in x["by_setting"]:
                setting = " ".join(f"{k}={v}" for k, v in b["setting"].items())
                out.append(f"    {setting}: {law_text(b['law'])}")
            continue
        out.append(f"  {x['family']}: {law_text(x['law'])}{where}")
    return out


def dominance_lines(ds: list[dict]) -> list[str]:
    out = []
    for d in ds:
        setting = " ".join(f"{k}={v}" for k, v in d["setting"].items()) or "every point"
        parts = []
        for r in d["runs"]:
            if d["axis"] is None:
                parts.append(r["family"])
            elif r["from"] == r["to"]:
                parts.append(f"{r['family']} at {d['axis']}={r['from']}")
            else:
                parts.append(f"{r['family']} from {d['axis']}={r['from']} to {r['to']}")
        out.append(f"  {setting}: " + ", ".join(parts))
    return out


def _dim(x, values: dict) -> int:
    if isinstance(x, int):
        return x
    if isinstance(x, tuple) and x[0] == "pad":
        return -(-int(values[x[1]]) // x[2]) * x[2]
    if isinstance(x, tuple) and x[0] == "min":
        return min(int(values[x[1]]), int(values[x[2]]))
    if isinstance(x, tuple):
        return min(int(values[x[0]]), x[1])
    return int(values[x])


def _dim_text(x) -> str:
    if isinstance(x, tuple) and x[0] == "pad":
        return f"pad({x[1]}, {x[2]})"
    if isinstance(x, tuple) and x[0] == "min":
        return f"min({x[1]}, {x[2]})"
    if isinstance(x, tuple):
        return f"min({x[0]}, {x[1]})"
    return str(x)


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _num(f: Fraction):
    return int(f) if f.denominator == 1 else float(f)
