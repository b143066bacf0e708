"""A sweep point summed up from its trace: the largest buffer each buffer type reached, consistency, and the
families at the peak of the graph that made the largest buffer (with each family's largest tensor's shape).

`summarise` reads a stored trace back, `summarise_imported` sums up a trace just read (from the replay's own
events, or its columns) before it is stored: the same answer. Both fill a `points.Point` in place.
"""
from __future__ import annotations

TOP_FAMILIES = 5


def summarise(store, p, tid: str):
    """A stored point's buffers (the largest each buffer type reached), consistency and peak families."""
    from alloctrace.traces.explain.peak import graph_peak

    rows = [{**g, "extra": store.graph_extra(tid, g["index"])} for g in store.summary(tid)["graphs"]]
    _summarise(p, rows, lambda row: graph_peak(store, tid, row["index"])[0])


def summarise_imported(p, trace, events: dict | None = None) -> None:
    """`summarise` of a trace a worker has just read (an ImportedTrace of EncodedGraphs), before it is stored:
    the same answer, from the graph in hand instead of the store: its replayed `events` by graph index where
    the reader kept them, else its columns decoded."""
    graphs = {g.index: g for g in trace.graphs}
    rows = [{"index": g.index, "consistent": g.consistent, "buffer_size": g.buffer_size, "max_size": g.max_size,
             "oom": g.oom, "extra": g.extra} for g in trace.graphs]

    def peak(row):
        if events is not None and row["index"] in events:
            return events_peak(events[row["index"]], row)
        from alloctrace.traces.store.columns import decode_arrays
        from alloctrace.traces.util.zstd import zstandard

        g = graphs[row["index"]]
        decompress = zstandard.ZstdDecompressor().decompress
        return events_peak(decode_arrays(g.n_events, g.blobs, g.strings, decompress), row)

    _summarise(p, rows, peak)


def events_peak(events: list, row: dict):
    """A ggml graph's peak from its events, asked as the store's peak of the graph is (peak_arguments)."""
    from alloctrace.traces.explain.peak_fast import peak_of_events
    from alloctrace.traces.explain.peak_types import peak_arguments

    return peak_of_events(events, **peak_arguments(row))


def _summarise(p, rows: list[dict], peak_of):
    p.consistent = all(g["consistent"] for g in rows) if rows else None
    best, best_total = None, -1
    for g in rows:
        sizes = buffer_sizes(g["extra"], g)
        for buft, size in sizes.items():
            p.buffers[buft] = max(p.buffers.get(buft, 0), size)
        if sum(sizes.values()) > best_total:
            best, best_total = g, sum(sizes.values())
    if best is None:
        return
    p.graph = best["index"]
    p.peak = peak_of(best)
    p.all_families = families_with_shapes(p.peak, best.get("extra") or {})
    p.families = p.all_families[:TOP_FAMILIES]


def buffer_sizes(extra: dict, row: dict) -> dict[str, int]:
    """One graph's buffer sizes by buffer type name: what ggml reported (`real_sizes`), else the plan's."""
    names = [t.get("name") or f"buffer {i}" for i, t in enumerate(extra.get("buffer_types") or ())]
    sizes = extra.get("real_sizes") or extra.get("model_sizes") or []
    if not names or not sizes:
        size = row.get("buffer_size") or row.get("max_size")
        return {} if size is None else {"(buffer)": int(size)}
    out: dict[str, int] = {}
    for n, s in zip(names, sizes):
        out[n] = out.get(n, 0) + int(s)  # two ids of one type object share one buffer (the other reports 0)
    return out


def families_with_shapes(peak, extra: dict) -> list[dict]:
    """The peak's families, each with its largest tensor's shape and type where the recording kept them."""
    from alloctrace.traces.explain.peak_shapes import label as label_of

    shapes = extra.get("shapes") or {}
    largest: dict[str, object] = {}
    for t in peak.live:
        cur = largest.get(t.family)
        if cur is None or t.bytes > cur.bytes:
            largest[t.family] = t
    out = []
    for fam, size in sorted(peak.family_bytes().items(), key=lambda kv: (-kv[1], kv[0])):
        t = largest[fam]
        row = {"family": fam, "bytes": size, "tensor": t.tensor, "tensor_bytes": t.bytes,
               "tensors": sum(1 for x in peak.live if x.family == fam)}
        s = shapes.get(t.tensor) if t.occurrence is None else None  # a shared name: whose shape is unknown
        if s:
            row["type"], row["ne"], row["op"] = s[0], s[1], s[2]
            row["label"] = label_of(t.tensor, shapes)
        out.append(row)
    return out
