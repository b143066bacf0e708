"""Explain a buffer's size: what is live at its high-water mark, and what changed between two runs.

A graph's *peak* is the allocation that sets its high-water mark (the end of the
highest block it ever placed, per buffer and chunk: a gallocr over several buffer
types tags its events with the buffer id). The bytes below that mark are either
live tensors, grouped here by *family* (the tensor's name without layer index and
ggml's decorations), or free holes (fragmentation). So for every graph

    high-water mark = sum of family bytes at the peak + fragmentation

and the size attribution between two graphs is exact by construction: the family
deltas plus the fragmentation delta add up to the difference of the two marks.

2023 logs report max_size as a running maximum across graphs; the mark here is
always the graph's own. Another trace source (a PyTorch snapshot) plugs in its own
peak computation with `register_peak(source, fn)`; ggml's is the default.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from alloctrace.traces.memmap.lifetimes import Lifetimes, extract
from alloctrace.traces.util.sizes import fmt_bytes

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

    def to_json(self) -> dict:
        return {"tensor": self.tensor, "family": self.family, "op": self.op, "bytes": self.bytes,
                "offset": self.offset, "chunk": self.chunk, "y0": self.y0, "start": self.start, "end": self.end}


@dataclass
class Moment:
    """What occupies a buffer (one chunk, or all of them) at one event: live tensors and holes."""

    event: int
    bytes: int  # the high-water mark (peak) or the buffer's capacity (failure)
    live: list[Live]
    free_below: int  # bytes below `bytes` held by no live tensor
    largest_hole: int
    holes: list = field(default_factory=list)  # the largest holes, each with what was freed there

    def families(self) -> list[dict]:
        return families_json(self.live, self.bytes)


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
                    "first_node": ts[0].tensor, "last_node": ts[-1].tensor, "first_event": ts[0].start,
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
            "families": m.families(), "fragmentation": {"free_below_peak": m.free_below,
                                                        "largest_hole": m.largest_hole, "holes": m.holes}}


def _live_at(lt: Lifetimes, event: int, chunk: int | None = None) -> np.ndarray:
    """Lifetimes holding bytes once `event` has happened."""
    sel = (lt.start <= event) & (lt.end > event)
    if chunk is not None:
        sel &= lt.chunk == chunk
    return np.flatnonzero(sel)


def _moment(lt: Lifetimes, idx: np.ndarray, event: int, top: int, chunk: int | None = None) -> Moment:
    live = [Live(str(lt.tensor[i] or ""), family_of(lt.tensor[i], lt.op[i]), lt.op[i], int(lt.size[i]),
                 int(lt.offset[i]), int(lt.chunk[i]), int(lt.y0[i]), int(lt.start[i]), int(lt.end[i]))
            for i in idx.tolist()]
    used = sum(t.bytes for t in live)
    # holes: the gaps between live tensors from the chunk's start up to `top`
    gaps, pos = [], 0
    for t in sorted(live, key=lambda t: t.offset):
        if t.offset > pos:
            gaps.append((pos, t.offset - pos))
        pos = max(pos, t.offset + t.bytes)
    if top > pos:
        gaps.append((pos, top - pos))
    m = Moment(event, top, live, top - used, max((n for _, n in gaps), default=0))
    m.holes = _freed_in(lt, sorted(gaps, key=lambda g: (-g[1], g[0]))[:MAX_HOLES], event, chunk)
    return m


MAX_HOLES = 8  # holes below a mark that say what was freed there (the largest)


def _freed_in(lt: Lifetimes, gaps: list, event: int, chunk: int | None) -> list[dict]:
    """Each hole and what last held its bytes before `event` (freed there, or never used: padding)."""
    out = []
    done = lt.end <= event
    if chunk is not None:
        done &= lt.chunk == chunk
    for off, size in gaps:
        hit = np.flatnonzero(done & (lt.offset < off + size) & (lt.offset + lt.size > off))
        hit = hit[np.argsort(-lt.end[hit], kind="stable")][:3]  # the latest holders first
        out.append({"offset": off, "bytes": size, "freed": [
            {"tensor": str(lt.tensor[i] or ""), "bytes": int(lt.size[i]), "freed_at": int(lt.end[i])} for i in hit]})
    return out


def _columns(events) -> dict:
    """The store's column form of a graph: passed through, or built from a list of Events."""
    if isinstance(events, dict):
        return events
    from alloctrace.traces.store.columns import encode, public_columns

    events = list(events)
    cols, table = encode(events)
    return public_columns(len(events), cols, table)


def ggml_peak(events, capacity: int | None = None, buffer_names: list[str] | None = None,
              buffer_sizes: list[int] | None = None) -> GraphPeak:
    """The peak of one ggml graph (its events, or the store's columns): one mark per (buffer, chunk).
    `capacity` is the real buffer's size, for the fragmentation at an out-of-space failure;
    `buffer_names` / `buffer_sizes` (a gallocr over several buffer types) name each buffer id and
    give its real size."""
    cols = _columns(events)
    kind = np.asarray(cols["kind"], dtype=object)
    buffer = cols.get("buffer")
    ids = sorted(set(np.asarray(buffer)[np.asarray(buffer) >= 0].tolist())) if buffer is not None else []
    per_buffer = {b: extract(_only_buffer(cols, kind, b)) for b in ids} or {None: extract(cols)}
    realloc = np.flatnonzero(kind == "realloc")
    last_plan = int(realloc[-1]) if len(realloc) else -1  # head re-planned: the last plan counts
    buffers = []
    for b, lt in per_buffer.items():
        after = lt.start > last_plan
        tops = lt.offset + lt.size
        for c in sorted(set(lt.chunk[after].tolist())):
            mine = np.flatnonzero(after & (lt.chunk == c))
            mark = int(tops[mine].max())
            setter = mine[tops[mine] == mark]
            k = int(setter[np.argmin(lt.start[setter])])
            event = int(lt.start[k])
            name = buffer_names[b] if b is not None and buffer_names and b < len(buffer_names) else None
            buffers.append({"buffer": b, "chunk": c, "name": name, "tensor": str(lt.tensor[k] or ""),
                            "moment": _moment(lt, _live_at(lt, event, c), event, mark, c)})
    peak = GraphPeak(buffers, len(kind))
    ooms = np.flatnonzero(kind == "oom")
    if len(ooms):
        b = int(buffer[ooms[0]]) if buffer is not None and buffer[ooms[0]] >= 0 else None
        if b is not None:  # the failing buffer's own lifetimes and real size
            capacity = buffer_sizes[b] if buffer_sizes and b < len(buffer_sizes) else None
        peak.failure = _failure(cols, int(ooms[0]), per_buffer[b] if b in per_buffer else extract(cols), capacity, b)
    return peak


def _only_buffer(cols: dict, kind: np.ndarray, b: int) -> dict:
    """The columns with every placing event of another buffer made inert (kind "other"): event
    indices stay those of the whole graph, and offsets of different buffers never meet."""
    other = (np.asarray(cols["buffer"]) != b) & (np.asarray(cols["buffer"]) >= 0)
    k = kind.copy()
    k[other] = "other"
    return {**cols, "kind": k}


def _failure(cols, e: int, lt: Lifetimes, capacity: int | None, buffer: int | None = None) -> dict:
    """The first out-of-space event `e`, with what filled the buffer then."""
    needed, largest = cols.get("needed"), cols.get("largest")
    tensor = cols["tensor"][e]
    need = int(needed[e]) if needed is not None and needed[e] >= 0 else None
    idx = _live_at(lt, e - 1, 0) if e > 0 else np.zeros(0, dtype=np.int64)
    top = capacity if capacity else int((lt.offset[idx] + lt.size[idx]).max(initial=0))
    m = _moment(lt, idx, e, top)
    out = {"event": e, "tensor": tensor, "needed": need,
           "largest_available": int(largest[e]) if largest is not None and largest[e] >= 0 else None,
           "capacity": capacity, "live_bytes": top - m.free_below, "free": m.free_below,
           "largest_hole": m.largest_hole, "families": m.families()}
    if buffer is not None:
        out["buffer"] = buffer
    return out


# --- sources ------------------------------------------------------------------------------------
PeakFn = Callable[..., GraphPeak]  # (columns, graph summary row) -> GraphPeak
PEAK_SOURCES: dict[str, PeakFn] = {}


def register_peak(source: str, fn: PeakFn) -> None:
    """Let a trace source (its TraceMeta.source, or the part before ':') compute its own peak."""
    PEAK_SOURCES[source] = fn


def _ggml_from_store(cols: dict, row: dict) -> GraphPeak:
    extra = row.get("extra") or {}  # a recording names its buffer types and their real sizes
    names = [t.get("name") for t in extra.get("buffer_types") or ()] or None
    return ggml_peak(cols, capacity=row.get("buffer_size") if row.get("oom") else None, buffer_names=names,
                     buffer_sizes=extra.get("real_sizes"))


def peak_fn(source: str | None) -> PeakFn:
    src = source or ""
    return PEAK_SOURCES.get(src) or PEAK_SOURCES.get(src.partition(":")[0]) or _ggml_from_store


def graph_peak(store, trace_id: str, g: int) -> tuple[GraphPeak, dict]:
    """A stored graph's peak and its summary row (role, max_size, buffer_size, ...)."""
    summary = store.summary(trace_id)
    row = next((x for x in summary["graphs"] if x["index"] == g), None)
    if row is None:
        from alloctrace.traces.store.store import NotFound

        raise NotFound(f"trace {summary['id']} has no graph {g}")
    cols = store.columns(summary["id"], g)
    row = {**row, "extra": store.graph_extra(summary["id"], g)}
    return peak_fn(summary.get("source"))(cols, row), row


def peak_json(store, ref: str) -> dict:
    """`alloctrace peak REF --json` and GET .../peak: ref is ID:G, or ID for its first graph."""
    tid, g = store.resolve(ref)
    if g is None:
        graphs = store.summary(tid)["graphs"]
        g = graphs[0]["index"] if graphs else 0
    peak, row = graph_peak(store, tid, g)
    out = peak.to_json(tid, g)
    out["role"], out["max_size"], out["buffer_size"] = row.get("role"), row.get("max_size"), row.get("buffer_size")
    from alloctrace.traces.explain.peak_shapes import annotate

    return annotate(out, (row.get("extra") or {}).get("shapes") or {})  # a recording knows ne and type


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


def graphs_attribution(events_a, events_b, meta_a=None, meta_b=None) -> dict:
    """size_attribution of two graphs (events or store columns); `meta_*` (a dict or a GraphRecord)
    may name the trace's `source`, whose peak rules then apply, and the graph's row fields."""
    peaks = []
    for events, meta in ((events_a, meta_a), (events_b, meta_b)):
        row = meta if isinstance(meta, dict) else (meta.summary() if hasattr(meta, "summary") else {})
        if hasattr(meta, "extra") and "extra" not in row:
            row = {**row, "extra": meta.extra}
        peaks.append(peak_fn(row.get("source"))(_columns(events), row))
    return size_attribution(*peaks)


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


def text_table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _bin(n: int) -> str:
    return f"{fmt_bytes(n)} ({n:,} B)"


def _signed(n: int) -> str:
    return f"{'+' if n >= 0 else '-'}{fmt_bytes(abs(n))} ({n:+,} B)"
