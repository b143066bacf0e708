"""Buffer sizes per commit: what the history page draws (GET /api/history).

The traces that carry the chosen tags are grouped by the value of one key (`commit` by default):
x is those values in the order their first trace was stored, or by each one's `order=` tag when
they have one (numbers sort as numbers); each line is one config, the traces' other tags (as
`compare` pairs them) and one buffer. A jump is a change between two neighbouring commits of a
line: the page links it to the compare of those two commits. Paged over the commits.
"""
from __future__ import annotations

from alloctrace.traces.errors import UserError

from alloctrace.traces.regress.compare import MAX_TRACES, NOT_PAIRED_BY, trace_buffers
from alloctrace.traces.store.tags import KEY_RE, as_dict, parse_tag

MAX_PAGE = 500


def _order_value(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def history(store, tags=(), key: str = "commit", offset: int = 0, limit: int = 50) -> dict:
    if not KEY_RE.match(key or ""):
        raise UserError(f"bad key {key!r}")
    if not 1 <= limit <= MAX_PAGE or offset < 0:
        raise UserError(f"limit must be 1-{MAX_PAGE} and offset at least 0")
    wanted = [parse_tag(t) for t in tags]
    found = [s for s in store.list(tags=wanted) if key in as_dict(s["tags"])]
    if len(found) > MAX_TRACES:
        raise UserError(f"{len(found)} traces carry those tags; at most {MAX_TRACES} (choose more tags)")
    found.reverse()  # oldest first: the order of import
    first: dict[str, int] = {}
    order: dict[str, str] = {}
    for i, s in enumerate(found):
        tags_of = as_dict(s["tags"])
        first.setdefault(tags_of[key], i)
        if "order" in tags_of:
            order.setdefault(tags_of[key], tags_of["order"])
    commits = sorted(first, key=lambda c: (_order_value(order[c]) if c in order else (2, 0.0, ""), first[c]))
    page = commits[offset:offset + limit]
    on_page = set(page)
    fixed = {t.partition("=")[0] for t in wanted} | {key}
    lines: dict[tuple, dict] = {}
    for s in found:
        tags_of = as_dict(s["tags"])
        if tags_of[key] not in on_page:
            continue
        config = tuple(sorted((k, v) for k, v in tags_of.items() if k not in fixed and k not in NOT_PAIRED_BY))
        for buffer, (size, graph) in trace_buffers(store, s).items():
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
