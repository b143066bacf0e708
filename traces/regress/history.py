"""Buffer sizes per commit: what the history page draws (GET /api/history).

The traces that carry the chosen tags are grouped by the value of one key (`commit` by default):
x is those values in the order their first trace was stored, or by each one's `order=` tag when
they have one (numbers sort as numbers); each line is one config, the traces' other tags (as
`compare` pairs them) and one buffer. A jump is a change between two neighbouring commits of a
line: the page links it to the compare of those two commits. Paged over the commits: the traces are
chosen by their tags alone (Store.tagged: no graph is read), and only the page's traces are read (a few
queries for all of them), so a store of 10,000 traces answers as fast as one of a hundred.
"""
from __future__ import annotations

from alloctrace.traces.errors import UserError

from alloctrace.traces.regress.compare import BUFFER_KEYS, MAX_TRACES, NOT_PAIRED_BY, trace_buffers
from alloctrace.traces.store.tags import KEY_RE, as_dict, parse_tag

MAX_PAGE = 500


def _order_value(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def _value(tags: list, key: str) -> str | None:
    """The value of `key=` among a trace's tags (the last one, as tags.as_dict), without making a dict of them."""
    prefix, found = key + "=", None
    for t in tags:
        if isinstance(t, str) and t.startswith(prefix):
            found = t[len(prefix):]
    return found


def history(store, tags=(), key: str = "commit", offset: int = 0, limit: int = 50) -> dict:
    if not KEY_RE.match(key or ""):
        raise UserError(f"bad key {key!r}")
    if not 1 <= limit <= MAX_PAGE or offset < 0:
        raise UserError(f"limit must be 1-{MAX_PAGE} and offset at least 0")
    wanted = [parse_tag(t) for t in tags]
    tagged = [(tid, _value(have, key), have) for tid, have in store.tagged(wanted, key)]  # oldest first
    first: dict[str, int] = {}
    order: dict[str, str] = {}
    for i, (_, commit, have) in enumerate(tagged):
        first.setdefault(commit, i)
        if commit not in order:
            o = _value(have, "order")
            if o is not None:
                order[commit] = o
    commits = sorted(first, key=lambda c: (_order_value(order[c]) if c in order else (2, 0.0, ""), first[c]))
    page = commits[offset:offset + limit]
    on_page = set(page)
    ids = [tid for tid, commit, _ in tagged if commit in on_page]
    if len(ids) > MAX_TRACES:
        raise UserError(f"{len(ids)} traces carry those tags on this page; at most {MAX_TRACES} (choose more tags "
                        "or a smaller limit)")
    found = store.summaries(ids)
    extras = store.graph_extras_of([s["id"] for s in found if s["source"] == "recording"], BUFFER_KEYS)
    fixed = {t.partition("=")[0] for t in wanted} | {key}
    lines: dict[tuple, dict] = {}
    for s in found:
        tags_of = as_dict(s["tags"])
        config = tuple(sorted((k, v) for k, v in tags_of.items() if k not in fixed and k not in NOT_PAIRED_BY))
        for buffer, (size, graph) in trace_buffers(store, s, extras.get(s["id"], {})).items():
            line = lines.setdefault((config, buffer), {"config": dict(config), "buffer": buffer, "points": {}})
            line["points"][tags_of[key]] = {"commit": tags_of[key], "size": size, "trace": s["id"], "graph": graph}
    series, jumps = [], []
    for (config, buffer), line in sorted(lines.items()):
        points = [line["points"][c] for c in page if c in line["points"]]
        label = " ".join(f"{k}={v}" for k, v in config) or "(all)"
        series.append({"config": line["config"], "label": label, "buffer": buffer, "points": points})
        for a, b in zip(points, points[1:]):
            if a["size"] != b["size"]:
                jumps.append({"label": label, "config": line["config"], "buffer": buffer, "base": a["commit"],
                              "head": b["commit"], "base_size": a["size"], "head_size": b["size"],
                              "delta": b["size"] - a["size"]})
    jumps.sort(key=lambda j: -abs(j["delta"]))
    return {"key": key, "tags": wanted, "total": len(commits), "offset": offset, "limit": limit,
            "commits": [{"value": c, "order": order.get(c)} for c in page], "series": series, "jumps": jumps}
