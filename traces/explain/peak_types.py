"""A peak's parts, as every way of computing one shares them: families, live tensors, moments, the
graph's peak and its JSON, and the size attribution between two peaks.

Plain Python, no numpy: a sweep's worker summarises its points with `peak_fast` and must not pay
numpy's import; `peak.py` computes the same objects over store columns and re-exports these names.
"""
from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from alloctrace.traces.util.sizes import fmt_bytes
from alloctrace.traces.util.textsafe import text_table

TOP_TENSORS = 2000  # tensors listed in a peak's JSON (families always count all of them)

_DECORATION = re.compile(r"\s*\((?:view|permuted|transposed|reshaped|cont|copy|copy of .*)\)")
_LAYER = re.compile(r"(?:-|_l|\.)\d+$")  # kq-12, cache_k_l3, name.7
_UNNAMED = re.compile(r"^(?:node|leaf)_\d+$")  # ggml's default names for unnamed tensors


def family_of(name: str | None, op: str | None = None) -> str:
    """A stable family for a tensor: `kq-12` -> `kq`, `ffn_up-3 (view)` -> `ffn_up`; an unnamed
    tensor (empty, `node_N`, `leaf_N`, only decorations) is known by its op."""
    base = name or ""
    m = _DECORATION.search(base)
    if m:
        base = base[:m.start()]
    base = _LAYER.sub("", base.strip())
    if not base or _UNNAMED.match(base):
        return op or "(unnamed)"
    return base


# --- which tensor: a name is no identity ------------------------------------------------------------
class Occurrences:
    """Tell apart tensors that share a name in one graph (several `node_7`, a layer name used twice): the
    k-th tensor of a plan placed under a name is `NAME #k`. A tensor is known by the event that placed it
    (an alloc or a reuse) and its bytes (chunk, offset), never by its name; the number only shows it."""

    def __init__(self, opens, reallocs):
        """`opens`: (event, name) of every alloc and reuse in event order; `reallocs`: the re-plans' events."""
        self.by_name: dict = {}
        for i, name in opens:
            self.by_name.setdefault(name or "", []).append(i)
        self.reallocs = sorted(reallocs)

    def of(self, name: str | None, at: int) -> int | None:
        """Which of its plan's tensors named `name` the one placed at event `at` is (1, 2, ...), None
        when the name is its plan's only one."""
        ev = self.by_name.get(name or "")
        if ev is None or len(ev) < 2:
            return None
        r = self.reallocs
        k = bisect_right(r, at)
        lo, hi = bisect_right(ev, r[k - 1] if k else -1), bisect_left(ev, r[k]) if k < len(r) else len(ev)
        if hi - lo < 2:
            return None
        return max(bisect_right(ev, at) - lo, 1)


def display_name(name: str | None, occurrence: int | None) -> str:
    """`node_7 #2` for the second tensor named node_7; the name alone where it is the only one."""
    return (name or "") if occurrence is None else f"{name or '(unnamed)'} #{occurrence}"


def unheld_bytes(lo: int, n: int, held: list[tuple[int, int]]) -> int:
    """Bytes of [lo, lo + n) that no interval of `held` ((offset, bytes), sorted by offset) covers."""
    covered, pos, end = 0, lo, lo + n
    for off, size in held:
        if off >= end:
            break
        a, b = max(off, pos), min(off + size, end)
        if b > a:
            covered += b - a
            pos = b
    return n - covered


def held_intervals(offsets, sizes) -> list[tuple[int, int]]:
    """(offset, bytes) sorted by offset, for `unheld_bytes`."""
    return sorted(zip(offsets, sizes))


# --- one graph's peak ---------------------------------------------------------------------------
@dataclass
class Live:
    """One tensor holding bytes at a moment: its memory-map lifetime [start, end)."""

    tensor: str
    family: str
    op: str | None
    bytes: int
    offset: int
    chunk: int
    y0: int  # offset in the memory map's stacked chunk space
    start: int  # event that placed these bytes (an alloc or a reuse)
    end: int  # event that released them (n_events: live at the end)
    occurrence: int | None = None  # k for the k-th tensor of the graph's plan with this name; None: the only one

    @property
    def display(self) -> str:
        return display_name(self.tensor, self.occurrence)

    def to_json(self) -> dict:
        return {"tensor": self.tensor, "occurrence": self.occurrence, "family": self.family, "op": self.op,
                "bytes": self.bytes, "offset": self.offset, "chunk": self.chunk, "y0": self.y0, "start": self.start,
                "end": self.end}


@dataclass
class Moment:
    """What occupies a buffer (one chunk, or all of them) at one event: live tensors and holes."""

    event: int
    bytes: int  # the high-water mark (peak) or the buffer's capacity (failure)
    live: list[Live]
    free_below: int  # bytes below `bytes` held by no live tensor
    largest_hole: int
    holes: list = field(default_factory=list)  # the largest holes, each with what was freed there
    unattributed: int = 0  # bytes of free_below that no logged tensor held before `event`

    def families(self) -> list[dict]:
        return families_json(self.live, self.bytes)


def peak_arguments(row: dict) -> dict:
    """What a ggml graph's peak is asked with, from its summary row and extra: the real buffer's size (for an
    out-of-space failure), and where a recording names them its buffer types and their real sizes."""
    extra = row.get("extra") or {}
    names = [t.get("name") for t in extra.get("buffer_types") or ()] or None
    return {"capacity": row.get("buffer_size") if row.get("oom") else None, "buffer_names": names,
            "buffer_sizes": extra.get("real_sizes")}


def holes_below(live: list[Live], top: int) -> list[tuple[int, int]]:
    """(offset, bytes) of each gap between the live tensors from the chunk's start up to `top`."""
    gaps, pos = [], 0
    for t in sorted(live, key=lambda t: t.offset):
        if t.offset > pos:
            gaps.append((pos, t.offset - pos))
        pos = max(pos, t.offset + t.bytes)
    if top > pos:
        gaps.append((pos, top - pos))
    return gaps


def families_json(live: list[Live], total: int) -> list[dict]:
    """Families by bytes (largest first): tensors, bytes, share of `total`, first and last node."""
    groups: dict[str, list[Live]] = {}
    for t in live:
        groups.setdefault(t.family, []).append(t)
    out = []
    for fam, ts in groups.items():
        ts.sort(key=lambda t: (t.start, t.offset))
        size = sum(t.bytes for t in ts)
        out.append({"family": fam, "tensors": len(ts), "bytes": size, "share": size / total if total else 0.0,
                    "first_node": ts[0].display, "last_node": ts[-1].display, "first_event": ts[0].start,
                    "last_event": ts[-1].start})
    out.sort(key=lambda f: (-f["bytes"], f["family"]))
    return out


@dataclass
class GraphPeak:
    """A graph's peak: per chunk (ggml) or pool (other sources), and all of them together."""

    buffers: list[dict]  # [{"buffer", "chunk", "name", "moment": Moment, "tensor": what set the mark}]
    n_events: int
    failure: dict | None = None  # the first out-of-space event, with what filled the buffer then

    @property
    def bytes(self) -> int:
        return sum(b["moment"].bytes for b in self.buffers)

    @property
    def live(self) -> list[Live]:
        return [t for b in self.buffers for t in b["moment"].live]

    @property
    def free_below(self) -> int:
        return sum(b["moment"].free_below for b in self.buffers)

    def _top(self) -> dict | None:
        """The buffer with the highest mark, the earliest set on ties (the only one for a single chunk)."""
        return max(self.buffers, key=lambda b: (b["moment"].bytes, -b["moment"].event), default=None)

    @property
    def event(self) -> int | None:
        """The event that set the largest buffer's mark (the only one for a single chunk)."""
        top = self._top()
        return top["moment"].event if top else None

    def family_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.live:
            out[t.family] = out.get(t.family, 0) + t.bytes
        return out

    def to_json(self, trace=None, graph=None, tensors: bool = True) -> dict:
        total = self.bytes
        top = self._top()
        out = {"trace": trace, "graph": graph,
               "peak": {"event": top["moment"].event if top else None, "bytes": total,
                        "tensor": top["tensor"] if top else None,
                        "live_bytes": total - self.free_below},
               "families": families_json(self.live, total),
               "accounting": _accounting(total, self.live, self.free_below,
                                         sum(b["moment"].unattributed for b in self.buffers)),
               "fragmentation": {"free_below_peak": self.free_below,
                                 "largest_hole": max((b["moment"].largest_hole for b in self.buffers), default=0),
                                 "holes": sorted((h for b in self.buffers for h in b["moment"].holes),
                                                 key=lambda h: -h["bytes"])[:MAX_HOLES]}}
        if len(self.buffers) > 1:
            out["buffers"] = [_buffer_json(b) for b in self.buffers]
        if tensors:
            live = sorted(self.live, key=lambda t: (-t.bytes, t.start))
            out["tensors"] = [t.to_json() for t in live[:TOP_TENSORS]]
            out["tensors_total"] = len(live)
        out["failure"] = self.failure
        out["n_events"] = self.n_events
        return out


def _buffer_json(b: dict) -> dict:
    m: Moment = b["moment"]
    return {"buffer": b.get("buffer"), "chunk": b["chunk"], "name": b.get("name"), "peak": {"event": m.event, "bytes": m.bytes, "tensor": b["tensor"],
                                          "live_bytes": m.bytes - m.free_below},
            "families": m.families(), "accounting": _accounting(m.bytes, m.live, m.free_below, m.unattributed),
            "fragmentation": {"free_below_peak": m.free_below,
                                                        "largest_hole": m.largest_hole, "holes": m.holes}}


MAX_HOLES = 8  # holes below a mark that say what was freed there (the largest)


def _accounting(total: int, live: list[Live], free_below: int, unattributed: int) -> dict:
    """Every byte below a mark, once: held by a live tensor (the bytes its allocator counted), free after a
    tensor that held it earlier (fragmentation), or held by no logged tensor (unattributed)."""
    held = sum(t.bytes for t in live)
    out = {"bytes": total, "tensors": len(live), "tensor_bytes": held, "freed_bytes": free_below - unattributed,
           "unattributed_bytes": unattributed}
    assert held + out["freed_bytes"] + unattributed == total
    return out


# --- attribution between two runs --------------------------------------------------------------
def size_attribution(a: GraphPeak, b: GraphPeak) -> dict:
    """B's high-water mark against A's, by family; family deltas + fragmentation_delta == delta."""
    fa, fb = a.family_bytes(), b.family_bytes()
    rows = []
    for fam in set(fa) | set(fb):
        x, y = fa.get(fam, 0), fb.get(fam, 0)
        rows.append({"family": fam, "a": x, "b": y, "delta": y - x,
                     "status": "appeared" if fam not in fa else "vanished" if fam not in fb else "both"})
    rows.sort(key=lambda r: (-abs(r["delta"]), -max(r["a"], r["b"]), r["family"]))
    out = {"a_bytes": a.bytes, "b_bytes": b.bytes, "delta": b.bytes - a.bytes, "families": rows,
           "fragmentation_delta": b.free_below - a.free_below,
           "a_fragmentation": a.free_below, "b_fragmentation": b.free_below,
           "a_peak_event": a.event, "b_peak_event": b.event,
           "appeared": sorted(r["family"] for r in rows if r["status"] == "appeared"),
           "vanished": sorted(r["family"] for r in rows if r["status"] == "vanished")}
    assert sum(r["delta"] for r in rows) + out["fragmentation_delta"] == out["delta"]
    return out


def attribution_lines(att: dict, top: int = 12) -> list[str]:
    """The attribution as an indented text table: A, B and B - A per family, then fragmentation."""
    rows = [["family", "a", "b", "b - a", ""]]
    for r in att["families"][:top]:
        rows.append([r["family"], fmt_bytes(r["a"]), fmt_bytes(r["b"]), _signed(r["delta"]),
                     "" if r["status"] == "both" else r["status"]])
    rest = att["families"][top:]
    if rest:
        rows.append([f"{len(rest)} more families", "", "", _signed(sum(r["delta"] for r in rest)), ""])
    rows.append(["fragmentation", fmt_bytes(att["a_fragmentation"]), fmt_bytes(att["b_fragmentation"]),
                 _signed(att["fragmentation_delta"]), ""])
    rows.append(["high-water mark", _bin(att["a_bytes"]), _bin(att["b_bytes"]), _signed(att["delta"]), ""])
    return ["  " + line for line in text_table(rows)]


def _bin(n: int) -> str:
    return f"{fmt_bytes(n)} ({n:,} B)"


def _signed(n: int) -> str:
    return f"{'+' if n >= 0 else '-'}{fmt_bytes(abs(n))} ({n:+,} B)"
