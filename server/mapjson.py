"""The memory-map answer encoded straight from its columns.

A view window is a few thousand shapes and free-list rows: building a dict per
row and running the generic JSON encoder over them cost more than cutting and
reducing the window itself. Rows are formatted from column lists with one
template; strings (tensor and op names) go through json.dumps once per distinct
name. The document parses to exactly the dict of the generic reductions (tests/test_server_mapjson.py
builds that reference and compares).
"""
from __future__ import annotations

import json

from alloctrace.traces import memmap

SHAPE_INTS = ("x0", "x1", "y0", "y1", "n")
SHAPE_NAMES = ("tensor", "op")
SHAPE_TAIL = ("size", "offset", "chunk")
SERIES = ("x", "used", "n_free", "largest_free", "total_free")


class _Quoted(dict):
    """name -> its JSON text, made on first use (None -> null)."""

    def __missing__(self, key):
        text = self[key] = json.dumps(key, ensure_ascii=False)
        return text


def _template(fields, kinds) -> str:
    return "{" + ",".join(f'"{f}":{k}' for f, k in zip(fields, kinds)) + "}"


SHAPE_ROW = _template(SHAPE_INTS + SHAPE_NAMES + SHAPE_TAIL, ("%d",) * 5 + ("%s",) * 2 + ("%d",) * 3)
SERIES_ROW = _template(SERIES, ("%d",) + ("%s",) * 4)


def _nullable(values: list) -> list:
    """ints as text, None as null."""
    return ["null" if v is None else str(v) for v in values]


def rows(template: str, columns: list) -> str:
    return "[" + ",".join(template % r for r in zip(*columns)) + "]"


def memory_map_json(lt: memmap.Lifetimes, info: dict, win, max_shapes: int, max_points: int) -> bytes:
    cols, total, merged = memmap.shape_columns(lt, win, max_shapes)
    quoted = _Quoted()
    names = [list(map(quoted.__getitem__, cols[k])) for k in SHAPE_NAMES]
    shapes = rows(SHAPE_ROW, [cols[k] for k in SHAPE_INTS] + names + [cols[k] for k in SHAPE_TAIL])
    series, bucket = memmap.series_columns(lt, win[0], win[1], max_points)
    free_list = rows(SERIES_ROW, [series["x"]] + [_nullable(series[k]) for k in SERIES[1:]])
    rest = {"n_events": lt.n_events, "window": dict(zip(("x0", "x1", "y0", "y1"), win)), "y_extent": lt.y_extent,
            "chunks": lt.chunks, "count": len(cols["x0"]), "total_in_view": total, "reduced": merged,
            "free_list_bucket": bucket, "max_size": info.get("max_size"), "buffer_size": info.get("buffer_size"),
            "oom": info.get("oom")}
    head = json.dumps(rest, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return ('{"shapes":' + shapes + ',"free_list":' + free_list + "," + head[1:]).encode("utf-8")
