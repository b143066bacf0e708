"""Diff two allocator runs: where they part, why, and what it cost.

`diff_graphs` lines up two graphs' placements (see align.py), finds the first
aligned allocation whose block, offset or chunk differs, the first aligned point
where the free lists differ, explains an out-of-space failure with the free
blocks and the live tensors that strand them, and sums up both runs.
`diff_refs` does the same for stored traces ("ID:GRAPH", or "ID" for every graph).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alloctrace.allocator.render import ggml_oom_message
from alloctrace.traces.diff.align import KIND_NAMES, NONE, align
from alloctrace.traces.util.gcpause import without_gc
from alloctrace.traces.diff.side import Cursor, Side, make_side, summary
from alloctrace.traces.state.free_list import free_summary, stranding

TOP = 10  # rows in the per-tensor delta tables


@dataclass
class DiffResult:
    first_divergence: dict | None
    first_free_list_divergence: dict | None
    a: dict
    b: dict
    deltas: dict
    aligned: dict
    anomalies: list = field(default_factory=list)
    first_choice_divergence: dict | None = None  # the first differing block/chunk/kind, offsets ignored
    size_attribution: dict | None = None  # the high-water delta by family (explain.py), for stored graphs
    lead: str = "divergence"  # "size": another program or configuration, where the sizes are the answer

    def to_json(self) -> dict:
        return {"lead": self.lead, "first_divergence": self.first_divergence, "size_attribution": self.size_attribution,
                "first_choice_divergence": self.first_choice_divergence,
                "first_free_list_divergence": self.first_free_list_divergence,
                "a": self.a, "b": self.b, "deltas": self.deltas, "aligned": self.aligned,
                "anomalies": self.anomalies}


@dataclass
class TraceDiff:
    """Two whole traces: their graphs paired in order."""

    ref_a: str
    ref_b: str
    pairs: list  # [(graph_a, graph_b, DiffResult)]
    unpaired_a: list
    unpaired_b: list

    def to_json(self) -> dict:
        first = next((i for i, (_, _, d) in enumerate(self.pairs) if d.first_divergence), None)
        return {"a": self.ref_a, "b": self.ref_b, "first_divergent_pair": first,
                "pairs": [{"graph_a": ga, "graph_b": gb, **d.to_json()} for ga, gb, d in self.pairs],
                "unpaired_a": self.unpaired_a, "unpaired_b": self.unpaired_b}


def _blocks_json(state: dict) -> list:
    return [list(b) for b in state["free_blocks"]]


def _block_of(state: dict, chunk: int, index: int):
    """The (offset, size) of a chunk's index-th free block (-1: its last), or None."""
    blocks = [b for b in state["free_blocks"] if b[2] == max(chunk, 0)]
    if not blocks or index >= len(blocks) or index < -1:
        return None
    return blocks[index][:2]


def _fmt_size(size) -> str:
    return "an endless block" if size is None else f"{size} B"


def _choice(side: Side, k: int, state: dict) -> dict:
    p = side.placements
    kind = KIND_NAMES[int(p.kind[k])]
    out = {"event": int(p.event[k]), "kind": kind, "tensor": p.names[k], "size": int(p.size[k])}
    for name, arr in (("block", p.block), ("offset", p.offset), ("chunk", p.chunk)):
        out[name] = None if arr[k] == NONE and not (name == "block" and kind == "alloc") else int(arr[k])
    if kind == "reuse":
        out["parent"] = p.parents[k]
    if state is not None:
        out["free_blocks"] = _blocks_json(state)
        if kind == "alloc" and out["block"] is not None:
            blk = _block_of(state, out["chunk"] or 0, out["block"])
            if blk:
                out["block_offset"], out["block_size"] = blk
    return out


def _choice_words(label: str, c: dict) -> str:
    if c["kind"] == "reuse":
        return f"{label} reused parent {c['parent']} (offset {c['offset']})"
    if c["kind"] == "oom":
        return f"{label} found no block for {c['size']} B"
    where = f"offset {c['offset']}" + (f", chunk {c['chunk']}" if c["chunk"] is not None else "")
    if "block_size" in c:
        which = "the last block, block -1" if c["block"] == -1 else f"block {c['block']}"
        return f"{label} took {which} ({_fmt_size(c['block_size'])}, {where})"
    return f"{label} took block {c['block']} ({where})"


def _why(ca: dict, cb: dict, sa: dict, sb: dict, la: str, lb: str) -> str:
    if ca["size"] != cb["size"]:
        return f"the tensor is {ca['size']} B in {la} and {cb['size']} B in {lb}"
    fa, fb = sa["free_blocks"], sb["free_blocks"]
    if fa == fb:
        return "the free lists were the same: the allocators' rules differ"
    if fa and fb and fa[:-1] == fb[:-1] and fa[-1][0] == fb[-1][0]:
        return (f"the free lists were the same except the last block: {_fmt_size(fa[-1][1])} in {la}, "
                f"{_fmt_size(fb[-1][1])} in {lb}")
    return "the free lists already differed"


# --- the two divergences ------------------------------------------------------------------
def _divergence_index(a: Side, b: Side, ia, ib, offsets: bool = True) -> int | None:
    """The first aligned pair whose kind, block, chunk or (with `offsets`) offset differs."""
    pa, pb = a.placements, b.placements
    ba, bb, oa, ob = pa.block[ia], pb.block[ib], pa.offset[ia], pb.offset[ib]
    # 2023-08-28 prints block -1 for "the last block": at the same offset it is the same choice
    same_last = ((ba == -1) | (bb == -1)) & (oa == ob) & (oa != NONE)
    differs = (pa.kind[ia] != pb.kind[ib]) | ((ba != bb) & ~same_last) | (pa.chunk[ia] != pb.chunk[ib])
    if offsets:
        known = (oa != NONE) & (ob != NONE) | (pa.kind[ia] != 1)  # imported reuse lines carry no offset
        differs |= known & (oa != ob)
    hits = np.flatnonzero(differs)
    return int(hits[0]) if len(hits) else None


def _first_divergence(a: Side, b: Side, ia, ib, k, cur_a: Cursor, cur_b: Cursor) -> dict | None:
    if k is None:
        return None
    pa, pb = a.placements, b.placements
    ka, kb = int(ia[k]), int(ib[k])
    ea, eb = int(pa.event[ka]), int(pb.event[kb])
    sa, sb = cur_a.state(ea), cur_b.state(eb)
    ca, cb = _choice(a, ka, sa), _choice(b, kb, sb)
    fields = [f for f in ("kind", "block", "offset", "chunk", "size") if ca[f] != cb[f]]
    words = (f"diverges at event {ea} in a, {eb} in b, tensor {pa.names[ka] or '(unnamed)'}: "
             f"{_choice_words('a', ca)}, {_choice_words('b', cb)}; {_why(ca, cb, sa, sb, 'a', 'b')}")
    return {"aligned_index": k, "event_a": ea, "event_b": eb, "tensor": pa.names[ka], "fields": fields,
            "a": ca, "b": cb, "words": words}


def _fields_at(a: Side, b: Side, ia, ib, k: int) -> list:
    """Which of kind, block, chunk, offset differ at aligned pair k."""
    pa, pb, x, y = a.placements, b.placements, int(ia[k]), int(ib[k])
    return [name for name, arr_a, arr_b in (("kind", pa.kind, pb.kind), ("block", pa.block, pb.block),
                                            ("chunk", pa.chunk, pb.chunk), ("offset", pa.offset, pb.offset))
            if arr_a[x] != arr_b[y]]


def _mutation_prefix(a: Side, b: Side) -> int:
    """How many free-list changes the two runs share from the start."""
    ma, mb = a.placements.mutations[:, 1:], b.placements.mutations[:, 1:]
    n = min(len(ma), len(mb))
    diff = np.flatnonzero(np.any(ma[:n] != mb[:n], axis=1))
    return int(diff[0]) if len(diff) else n


def _first_free_list_divergence(a: Side, b: Side, ia, ib, cur_a: Cursor, cur_b: Cursor) -> dict | None:
    """The first aligned placement before which the free lists differ (or the end states)."""
    pa, pb = a.placements, b.placements
    ea_all = np.append(pa.event[ia], len(a.events))  # the ends are compared too
    eb_all = np.append(pb.event[ib], len(b.events))
    ma = np.searchsorted(pa.mutations[:, 0], ea_all)  # free-list changes before each point
    mb = np.searchsorted(pb.mutations[:, 0], eb_all)
    shared = _mutation_prefix(a, b)
    # the ends are compared only when every placement aligned
    limit = len(ea_all) if len(ia) == max(len(pa), len(pb)) else len(ea_all) - 1
    unsure = np.flatnonzero(((ma != mb) | (ma > shared))[:limit])
    if not len(unsure):
        return None  # both runs made the same changes before every aligned point
    k0 = int(unsure[0])
    common = min(shared, int(ma[k0]), int(mb[k0]))  # changes both sides make alike before k0
    cur_a.run_to(cur_a.event_of_change(common))
    if pa.mutation_names[:common] == pb.mutation_names[:common]:  # same tensors too: b starts from a's state
        cur_b.adopt(cur_a, common)
    ra, rb = cur_a.replay, cur_b.replay
    k = k0
    while True:
        ea, eb = int(ea_all[k]), int(eb_all[k])
        cur_a.run_to(ea)
        cur_b.run_to(eb)
        if ra.free.shape() != rb.free.shape():  # (ra.free is replaced when head re-plans)
            break
        # equal here: skip the points both runs reach through the same further changes
        ahead = _agreed(pa.mutations, pb.mutations, cur_a.j, cur_b.j)
        da, db = ma[k + 1:limit] - cur_a.j, mb[k + 1:limit] - cur_b.j
        rest = np.flatnonzero((da != db) | (da > ahead))
        if not len(rest):
            return None
        k += 1 + int(rest[0])
    sa, sb = ra.state(), rb.state()
    at_end = k == len(ea_all) - 1
    tensor = None if at_end else pa.names[int(ia[k])]
    where = "at the end" if at_end else f"before {tensor} is placed"
    return {"aligned_index": None if at_end else k, "event_a": ea, "event_b": eb, "tensor": tensor,
            "a": {"free_blocks": _blocks_json(sa), **free_summary(sa)},
            "b": {"free_blocks": _blocks_json(sb), **free_summary(sb)},
            "words": (f"free lists differ {where} (event {ea} in a, {eb} in b): "
                      f"a has {_list_words(sa)}; b has {_list_words(sb)}")}


def _agreed(ma, mb, ja: int, jb: int) -> int:
    """How many free-list changes from a's ja-th and b's jb-th on are the same (windows that double,
    so the cost follows the answer)."""
    n, done, width = min(len(ma) - ja, len(mb) - jb), 0, 64
    while done < n:
        w = min(width, n - done)
        x, y = ma[ja + done:ja + done + w, 1:], mb[jb + done:jb + done + w, 1:]
        bad = np.flatnonzero(np.any(x != y, axis=1))
        if len(bad):
            return done + int(bad[0])
        done, width = done + w, width * 2
    return n


def _list_words(state: dict) -> str:
    blocks = state["free_blocks"]
    shown = ", ".join(f"{_fmt_size(s)} at {o}" for o, s, _ in blocks[:6])
    more = f" and {len(blocks) - 6} more" if len(blocks) > 6 else ""
    return f"{len(blocks)} free block{'s' if len(blocks) != 1 else ''} ({shown}{more})"


# --- out of space -------------------------------------------------------------------------
def _oom_point(side: Side, other: Side, mine, theirs):
    """(placement, event) of the first failed allocation, and the other side's aligned
    (placement, event) or None."""
    fails = np.flatnonzero(side.placements.kind == 2)
    if not len(fails):
        return None
    k = int(fails[0])
    hit = np.flatnonzero(mine == k)
    there = None
    if len(hit):
        j = int(theirs[hit[0]])
        there = (j, int(other.placements.event[j]))
    return (k, int(side.placements.event[k])), there


def _oom(side: Side, other: Side, point, cur: Cursor, other_cur: Cursor) -> dict | None:
    if point is None:
        return None
    (k, e), there = point
    p = side.placements
    oom_ev = next((x for x in (side.events[i] for i in range(e, min(e + 3, len(side.events)))) if x.kind == "oom"),
                  None)
    state = cur.state(e)
    free = free_summary(state)
    needed = (oom_ev.needed if oom_ev is not None else None) or int(p.size[k])
    largest = oom_ev.largest if oom_ev is not None and oom_ev.largest is not None else free["largest"]
    strands = [g for g in stranding(state) if g["live"]]
    out = {"event": e, "tensor": p.names[k], "needed": needed, "largest_free": largest,
           "total_free": free["total"], "n_free_blocks": free["n_blocks"], "free_blocks": _blocks_json(state),
           "stranded_by": strands}
    keep = ", ".join(f"{t['tensor'] or '(unnamed)'} ({t['size']} B at {t['offset']})"
                     for g in strands for t in g["live"])
    out["ggml_line"] = ggml_oom_message(side.meta.get("generation"), needed, largest)
    out["words"] = (f"{side.key} ran out of space: {p.names[k]} needed {needed} B, the largest free block is {largest} B of "
                    f"{free['total']} B free in {free['n_blocks']} blocks" + (f", kept apart by {keep}" if keep else ""))
    if there is not None:
        j, oe = there
        ostate = other_cur.state(oe)
        c = _choice(other, j, ostate)
        out["other"] = {**c, **{"free_" + key: v for key, v in free_summary(ostate).items()}}
        out["words"] += f"; at the same point {_choice_words(other.key, c)}"
    else:
        out["other"] = None
        out["words"] += f"; {other.key} never placed {p.names[k]}"
    return out


# --- summaries ----------------------------------------------------------------------------
def _top(names, rows, delta, a_vals, b_vals) -> list:
    """The TOP largest |delta|; `rows[i]` is the placement whose name is shown."""
    nz = np.flatnonzero(delta)
    if not len(nz):
        return []
    order = nz[np.argsort(-np.abs(delta[nz]), kind="stable")][:TOP]
    return [{"tensor": names[rows[i]], "a": int(a_vals[i]), "b": int(b_vals[i]), "delta": int(delta[i])}
            for i in order]


def _deltas(a: Side, b: Side, sa: dict, sb: dict, ia, ib) -> dict:
    pa, pb = a.placements, b.placements
    both = (pa.kind[ia] == 0) & (pb.kind[ib] == 0)
    ja, jb = ia[both], ib[both]
    out = {key: sb[key] - sa[key] for key in ("max_size", "peak_live", "allocs", "reuses", "frees", "events")}
    out["offsets"] = _top(pa.names, ja, pb.offset[jb] - pa.offset[ja], pa.offset[ja], pb.offset[jb])
    out["sizes"] = _top(pa.names, ja, pb.size[jb] - pa.size[ja], pa.size[ja], pb.size[jb])
    par_a = np.asarray(pa.parents + [None], dtype=object)[:-1][ia]  # (+ None: keeps a 1-d object array)
    par_b = np.asarray(pb.parents + [None], dtype=object)[:-1][ib]
    odd = np.flatnonzero(par_a != par_b)
    out["reuse_count"] = len(odd)
    out["reuse"] = [{"tensor": pa.names[int(ia[k])], "a": par_a[k], "b": par_b[k]} for k in odd[:TOP * 2].tolist()]
    return out


@without_gc  # the diff's entry point: many small live records, no cycles
def diff_graphs(events_a, events_b, meta_a=None, meta_b=None) -> DiffResult:
    """Diff two graphs' event lists. `meta_*` (a GraphRecord or a dict) may give `label`, `role`,
    `max_size`, `buffer_size` (a real 2023 buffer's end), `capacity` and `alignment`."""
    a, b = make_side(events_a, meta_a, "a"), make_side(events_b, meta_b, "b")
    if a.label == b.label:
        a.label, b.label = f"{a.label} (a)", f"{b.label} (b)"
    ia, ib = align(a.placements, b.placements)
    k = _divergence_index(a, b, ia, ib)
    kc = k if k is None or "offset" not in _fields_at(a, b, ia, ib, k) else _divergence_index(a, b, ia, ib, False)
    oom_a, oom_b = _oom_point(a, b, ia, ib), _oom_point(b, a, ib, ia)
    points_a, points_b = [], []
    for x in {k, kc} - {None}:
        points_a.append(int(a.placements.event[ia[x]]))
        points_b.append(int(b.placements.event[ib[x]]))
    for point, mine, theirs in ((oom_a, points_a, points_b), (oom_b, points_b, points_a)):
        if point is not None:
            mine.append(point[0][1])
            if point[1] is not None:
                theirs.append(point[1][1])
    cur_a, cur_b = Cursor(a, points_a), Cursor(b, points_b)
    free_list = _first_free_list_divergence(a, b, ia, ib, cur_a, cur_b)
    first = _first_divergence(a, b, ia, ib, k, cur_a, cur_b)
    choice = first if kc == k else _first_divergence(a, b, ia, ib, kc, cur_a, cur_b)
    sum_a, sum_b = summary(a), summary(b)
    sum_a["oom"] = _oom(a, b, oom_a, cur_a, cur_b)
    sum_b["oom"] = _oom(b, a, oom_b, cur_b, cur_a)
    na, nb = len(a.placements), len(b.placements)
    aligned = {"count": len(ia), "a": na, "b": nb, "fraction": len(ia) / max(na, nb, 1),
               "fraction_a": len(ia) / max(na, 1), "fraction_b": len(ia) / max(nb, 1)}
    anomalies = [f"{side.key}: {x}" for side, cur in ((a, cur_a), (b, cur_b)) for x in cur.replay.free.anomalies]
    from alloctrace.traces.explain.peak import graphs_attribution

    return DiffResult(first, free_list, sum_a, sum_b, _deltas(a, b, sum_a, sum_b, ia, ib), aligned, anomalies[:20],
                      choice, graphs_attribution(events_a, events_b, meta_a, meta_b))


# --- stored traces ------------------------------------------------------------------------
def _graphs(store, trace_id) -> dict:
    """index -> the store's summary row of each graph (role, max_size, buffer_size, ...)."""
    graphs = store.summary(trace_id).get("graphs") or []
    return {g["index"]: g for g in graphs}


def _load(store, trace_id, g: int, rows: dict):
    """A graph's events as the store's columns (no Event objects), and its metadata."""
    meta = dict(rows.get(g) or {})
    meta["label"] = f"{trace_id}:{g} {meta.get('role') or ''}".strip()
    info = store.meta(trace_id) if hasattr(store, "meta") else None
    meta["source"] = info.source if info else None  # whose peak rules apply
    meta["generation"] = info.generation if info else None  # how ggml words its failure
    events = store.columns(trace_id, g) if hasattr(store, "columns") else store.events(trace_id, g)
    return events, meta


def _pair(store, ta, x, rows_a, tb, y, rows_b) -> DiffResult:
    events_a, meta_a = _load(store, ta, x, rows_a)
    events_b, meta_b = _load(store, tb, y, rows_b)
    d = diff_graphs(events_a, events_b, meta_a, meta_b)
    if ta != tb and sizes_differ(d):
        d.lead = "size"
    return d


def sizes_differ(d: DiffResult) -> bool:
    """Whether two runs are another program or configuration rather than another allocator decision: most
    tensors do not pair up by identity, or paired tensors differ in size (another context, batch or model).
    Then the first divergence only follows from the sizes, and the size attribution is the answer."""
    return min(d.aligned["fraction_a"], d.aligned["fraction_b"]) < 0.5 or bool(d.deltas["sizes"])


def diff_refs(store, ref_a: str, ref_b: str):
    """"ID:GRAPH" against "ID:GRAPH" gives a DiffResult; if either ref is a whole trace ("ID"),
    graphs are paired in order and a TraceDiff comes back."""
    (ta, ga), (tb, gb) = store.resolve(ref_a), store.resolve(ref_b)
    rows_a, rows_b = _graphs(store, ta), _graphs(store, tb)
    if ga is not None and gb is not None:
        return _pair(store, ta, ga, rows_a, tb, gb, rows_b)
    list_a = [ga] if ga is not None else sorted(rows_a)
    list_b = [gb] if gb is not None else sorted(rows_b)
    n = min(len(list_a), len(list_b))
    pairs = [(x, y, _pair(store, ta, x, rows_a, tb, y, rows_b)) for x, y in zip(list_a[:n], list_b[:n])]
    return TraceDiff(ref_a, ref_b, pairs, list_a[n:], list_b[n:])
