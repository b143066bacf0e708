"""The memory-map answer encoded straight from its columns.

A view window is a few thousand shapes and free-list rows: building a dict per
row and running the generic JSON encoder over them cost more than cutting and
reducing the window itself. Rows are formatted from column lists with one
template; strings (tensor and op names) go through the C string encoder json.dumps
uses, a column at a time. The document parses to exactly the dict of the generic
reductions (tests/server/test_server_mapjson.py builds that reference and compares).

With the graph's tile pyramid (traces/memmap/lod.py) built, a reduced window is
rows of pyramid tiles: each tile's row and each series bucket's row is formatted
once per graph (`prepare`, when the graph's lifetimes are built) and kept with the
pyramid, so an answer is mostly a join and no request formats a whole level.
"""
from __future__ import annotations

import functools
import json
import threading
from json.encoder import encode_basestring

import numpy as np

from alloctrace.traces import memmap

from alloctrace.traces.memmap import lod as memmap_lod

SHAPE_INTS = ("x0", "x1", "y0", "y1", "n")
SHAPE_NAMES = ("tensor", "op")
SHAPE_TAIL = ("size", "offset", "chunk")
SERIES = ("x", "used", "n_free", "largest_free", "total_free")
SERIES_CACHED = 1 << 16  # series levels of up to this many buckets keep their JSON rows (~70 bytes each);
# deeper levels serve only windows a few thousand events wide: their rows (at most max_points) are made per request


def quote_names(values) -> list[str]:
    """Names as JSON text, exactly as json.dumps(name, ensure_ascii=False) writes each: the C string
    encoder json.dumps itself calls, over the whole column; a column with None or non-string names
    goes through json.dumps one by one."""
    try:
        return list(map(encode_basestring, values))
    except TypeError:  # None (null) or not a string
        return [json.dumps(v, ensure_ascii=False) for v in values]


def _template(fields, kinds) -> str:
    return "{" + ",".join(f'"{f}":{k}' for f, k in zip(fields, kinds)) + "}"


SHAPE_ROW = _template(SHAPE_INTS + SHAPE_NAMES + SHAPE_TAIL, ("%d",) * 5 + ("%s",) * 2 + ("%d",) * 3)
SERIES_ROW = _template(SERIES, ("%d",) + ("%s",) * 4)


def _nullable(values: list) -> list:
    """ints as text, None as null."""
    return ["null" if v is None else str(v) for v in values]


def shape_rows(cols: dict) -> list[str]:
    names = [quote_names(cols[k]) for k in SHAPE_NAMES]
    return [SHAPE_ROW % r for r in zip(*([cols[k] for k in SHAPE_INTS] + names + [cols[k] for k in SHAPE_TAIL]))]


def series_rows(cols: dict) -> list[str]:
    return [SERIES_ROW % r for r in zip(*([cols["x"]] + [_nullable(cols[k]) for k in SERIES[1:]]))]


def _tile_rows(lt: memmap.Lifetimes, level: int) -> tuple[list[str], np.ndarray]:
    """Every tile of a pyramid level as its JSON row (with all its members as `n`), made once."""
    lv = lt.lod.levels[level]
    rows = _face(lt, ("json-tiles", level),
                 lambda: shape_rows(memmap_lod.tile_columns(lt, lv, np.arange(len(lv.key)), lv.count)))
    return rows, lv.count


def _face(lt: memmap.Lifetimes, key, build):
    """What the server derives once per graph from its pyramid (kept in `faces`); built by one
    request while concurrent ones for the same graph wait for it."""
    faces = lt.lod.faces
    got = faces.get(key)
    if got is None:
        with faces.setdefault("lock", threading.RLock()):  # setdefault is atomic: one lock per graph
            got = faces.get(key)
            if got is None:
                got = faces[key] = build()
    return got


def prepare(lt: memmap.Lifetimes) -> memmap.Lifetimes:
    """Format every tile level's rows and every cached series level now, so that no later request
    pays for a whole level (a tail of hundreds of ms under load). Returns `lt`."""
    if lt.lod is None:
        return lt
    for level in range(len(lt.lod.levels)):
        _tile_rows(lt, level)
    for k, level in enumerate(lt.lod.series):
        if len(level[0]) <= SERIES_CACHED:
            _series_buffer(lt, k)
    return lt


def _level_rows(lt: memmap.Lifetimes, k: int, lo: int, hi: int) -> list[str]:
    """Rows lo..hi of series level k (memmap_lod.series_columns' rows). A bucket's worst cases are
    whole numbers, NaN (not known yet: only before the first event that carries them) is null; a
    column without NaN is formatted as ints by the row template itself."""
    cols, kinds = [], ["%d"]
    for a in lt.lod.series[k]:
        a = a[lo:hi]
        nan = np.isnan(a)
        if nan.any():
            text = list(map(str, np.where(nan, 0, a).astype(np.int64).tolist()))
            for i in np.flatnonzero(nan).tolist():
                text[i] = "null"
            cols.append(text)
            kinds.append("%s")
        else:
            cols.append(a.astype(np.int64).tolist())
            kinds.append("%d")
    row = _series_template(tuple(kinds))
    return list(map(row.__mod__, zip((np.arange(lo, hi) << k).tolist(), *cols)))


@functools.lru_cache(maxsize=None)
def _series_template(kinds: tuple) -> str:
    return _template(SERIES, kinds)


def _series_text(lt: memmap.Lifetimes, k: int, lo: int, hi: int) -> bytes:
    """Rows lo..hi of series level k; levels of up to SERIES_CACHED buckets are formatted once, into one
    buffer, so an answer is one slice of it."""
    if len(lt.lod.series[k][0]) > SERIES_CACHED:
        return ("[" + ",".join(_level_rows(lt, k, lo, hi)) + "]").encode()
    buf, starts = _series_buffer(lt, k)
    return b"[" + buf[starts[lo]:starts[hi] - 1] + b"]"


def _series_buffer(lt: memmap.Lifetimes, k: int) -> tuple[bytes, np.ndarray]:
    """The whole level as one buffer of rows, each with a trailing comma, and where each row starts
    (plus the end). The rows are ASCII: a character is a byte."""
    def build():
        rows = _level_rows(lt, k, 0, len(lt.lod.series[k][0]))
        starts = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)) + 1, out=starts[1:])
        return ("".join(r + "," for r in rows)).encode("ascii"), starts
    return _face(lt, ("json-series", k), build)


def _shapes_and_series(lt: memmap.Lifetimes, win, max_shapes: int, max_points: int):
    """(shapes JSON, shapes, lifetimes in view, reduced, free-list JSON, bucket width); JSON as UTF-8."""
    if lt.lod is None:
        cols, total, merged = memmap.shape_columns(lt, win, max_shapes)
        series, bucket = memmap.series_columns(lt, win[0], win[1], max_points)
        shapes = shape_rows(cols)
        return ("[" + ",".join(shapes) + "]").encode(), len(shapes), total, merged, \
            ("[" + ",".join(series_rows(series)) + "]").encode(), bucket
    got, total = memmap_lod.answer(lt, lt.lod, win, max_shapes)
    if isinstance(got, memmap_lod.Tiles):  # rows made once per tile; tiles cut by the window say their own n
        pre, count = _tile_rows(lt, got.level)
        out = [pre[r] for r in got.rows.tolist()]
        cut = np.flatnonzero(count[got.rows] != got.n)
        if len(cut):
            lv = lt.lod.levels[got.level]
            cut_cols = memmap_lod.tile_columns(lt, lv, got.rows[cut], got.n[cut])
            for j, row in zip(cut.tolist(), shape_rows(cut_cols)):
                out[j] = row
        merged = True
    else:  # the lifetimes in view, exact or bucketed over the window
        cols, _, merged = memmap.shape_columns(lt, win, max_shapes, vis=got)
        out = shape_rows(cols)
    shapes, count = ("[" + ",".join(out) + "]").encode(), len(out)
    span = memmap_lod.series_range(lt, lt.lod, win[0], win[1], max_points)
    if span is None:
        return shapes, count, total, merged, b"[]", 1
    k, lo, hi = span
    return shapes, count, total, merged, _series_text(lt, k, lo, hi), 1 << k


def memory_map_json(lt: memmap.Lifetimes, info: dict, win, max_shapes: int, max_points: int) -> bytes:
    shapes, count, total, merged, free_list, bucket = _shapes_and_series(lt, win, max_shapes, max_points)
    rest = {"n_events": lt.n_events, "window": dict(zip(("x0", "x1", "y0", "y1"), win)), "y_extent": lt.y_extent,
            "chunks": lt.chunks, "count": count, "total_in_view": total, "reduced": merged,
            "free_list_bucket": bucket, "max_size": info.get("max_size"), "buffer_size": info.get("buffer_size"),
            "oom": info.get("oom")}
    head = json.dumps(rest, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return b'{"shapes":' + shapes + b',"free_list":' + free_list + b"," + head[1:].encode("utf-8")
