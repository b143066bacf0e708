"""The memory map of one graph: tensor lifetimes as rectangles, reduced to what a screen can show.

A lifetime runs from the event that placed a tensor (`alloc`, or `reuse` of its
parent's bytes) to the event that gave the bytes back (`free`, the next reuse of
the same bytes, a head `realloc`) or to the end of the graph. Its height is the
tensor's address range; views have none of their own and are left out. Every
step is numpy over whole columns, so a million-event graph is extracted once
(and cached) and each view window is cut and reduced in milliseconds.
"""
from __future__ import annotations

import functools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from .errors import UserError

MISSING = -1
GRID = 1024  # finest bucket grid per axis: about one cell per screen pixel


def int_column(col, n: int) -> np.ndarray:
    """A column as int64 with MISSING for absent values, whatever the store's encoding
    (ints, floats with NaN, masked arrays, objects with None)."""
    if col is None:
        return np.full(n, MISSING, dtype=np.int64)
    if isinstance(col, np.ma.MaskedArray):
        col = col.astype(np.float64).filled(np.nan)
    a = np.asarray(col)
    if a.dtype.kind in "iub":
        return a.astype(np.int64)
    if a.dtype.kind == "f":
        out = np.full(len(a), MISSING, dtype=np.int64)
        ok = ~np.isnan(a)
        out[ok] = a[ok].astype(np.int64)
        return out
    return np.fromiter((MISSING if v is None else int(v) for v in a), dtype=np.int64, count=len(a))


def str_column(col, n: int) -> np.ndarray:
    if col is None:
        return np.full(n, None, dtype=object)
    return np.asarray(col, dtype=object)


@dataclass
class Lifetimes:
    """One graph's tensor lifetimes plus its per-event free-list series."""

    n_events: int
    start: np.ndarray  # event index that placed the bytes
    end: np.ndarray  # event index that released them (n_events: still live at the end)
    y0: np.ndarray  # address range in the stacked chunk space: chunk base + offset
    y1: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    chunk: np.ndarray
    tensor: np.ndarray  # object array of names
    op: np.ndarray
    chunks: list  # [{"chunk", "base", "extent"}]
    used: np.ndarray  # live bytes after each event (float64, exact below 2**53)
    n_free: np.ndarray  # forward-filled from the events that carry them; NaN before the first
    largest_free: np.ndarray
    total_free: np.ndarray
    _by_start: tuple | None = field(default=None, repr=False, compare=False)  # see `in_events`
    lod: object = field(default=None, repr=False, compare=False)  # memmap_lod.Pyramid, once built (`with_lod`)

    @functools.cached_property
    def y_extent(self) -> int:
        return int(self.y1.max()) if len(self.y1) else 0

    def in_window(self, win) -> np.ndarray:
        """Lifetimes that overlap the window (x0, x1, y0, y1), in index order."""
        x0, x1, y0, y1 = win
        if self._wide(x0, x1):
            return np.flatnonzero((self.start < x1) & (self.end > x0) & (self.y0 < y1) & (self.y1 > y0))
        vis = self.in_events(x0, x1)
        return vis[(self.y0[vis] < y1) & (self.y1[vis] > y0)]

    def _wide(self, x0: int, x1: int) -> bool:
        return (x1 - x0) * 4 >= self.n_events or len(self.start) < 4096

    def in_events(self, x0: int, x1: int) -> np.ndarray:
        """Lifetimes that overlap events [x0, x1), in index order. A narrow window looks only at the
        lifetimes starting shortly before it (sorted by start, built once) plus the few long ones,
        instead of scanning every lifetime of the graph."""
        if self._wide(x0, x1):
            return np.flatnonzero((self.start < x1) & (self.end > x0))
        if self._by_start is None:
            length = self.end - self.start
            span = int(np.percentile(length, 99))
            short = np.flatnonzero(length <= span)
            order = short[np.argsort(self.start[short], kind="stable")]
            self._by_start = (span, order, self.start[order], np.flatnonzero(length > span))
        span, order, starts, long = self._by_start
        lo, hi = np.searchsorted(starts, (x0 - span, x1))
        cand = np.concatenate([order[lo:hi], long])
        cand.sort()
        return cand[(self.start[cand] < x1) & (self.end[cand] > x0)]


def _forward_fill(values: np.ndarray) -> np.ndarray:
    """Each event gets the latest value at or before it; NaN before the first one."""
    n = len(values)
    has = values != MISSING
    idx = np.where(has, np.arange(n), -1)
    np.maximum.accumulate(idx, out=idx)
    out = np.where(idx >= 0, values[np.maximum(idx, 0)], 0).astype(np.float64)
    out[idx < 0] = np.nan
    return out


_ALLOC, _REUSE, _FREE, _FREE_EXTRA, _REALLOC = range(1, 6)  # the kinds extract() tells apart (0: others)
_KIND_CODES = {"alloc": _ALLOC, "reuse": _REUSE, "free": _FREE, "free_extra": _FREE_EXTRA, "realloc": _REALLOC}


def lifetime_items(closes, fe, fe_r, opens, is_alloc, size, offset, key):
    """The items lifetimes are cut from, unsorted: the events that close a lifetime, the head free_extras
    that close and reopen it (`fe`, each with its reuse `fe_r`), the events that open one.
    Returns (event, source event, opens?, own size or MISSING, key of the bytes)."""
    item_i = np.concatenate([closes, fe, opens, fe])
    item_src = np.concatenate([closes, fe_r, opens, fe_r])
    item_open = np.concatenate([np.zeros(len(closes) + len(fe), bool), np.ones(len(opens) + len(fe), bool)])
    own = np.concatenate([np.full(len(closes) + len(fe), MISSING), np.where(is_alloc[opens], size[opens], MISSING),
                          offset[fe] - offset[fe_r]])
    return item_i, item_src, item_open, own, key[item_src]


def extract(cols: dict) -> Lifetimes:
    """Lifetimes from a graph's event columns (one array per Event field)."""
    kind = np.asarray(cols["kind"], dtype=object) if len(cols["kind"]) else np.array([], dtype=object)
    n = len(kind)
    idx = np.arange(n, dtype=np.int64)
    offset, size = int_column(cols.get("offset"), n), int_column(cols.get("size"), n)
    chunk = np.maximum(int_column(cols.get("chunk"), n), 0)
    tensor, op = str_column(cols.get("tensor"), n), str_column(cols.get("op"), n)
    # the kinds that matter as small codes, in one pass: comparing a million-entry object array
    # with a string is a pass of Python comparisons each time
    code = np.fromiter(map(_KIND_CODES.get, kind, repeat(0)), dtype=np.int8, count=n)

    if np.any((code == _REUSE) & (offset == MISSING)):
        _place_reuses(kind, tensor, str_column(cols.get("parent"), n), str_column(cols.get("view_src"), n),
                      offset, chunk)
    placed = offset != MISSING
    is_alloc = (code == _ALLOC) & placed
    is_reuse = (code == _REUSE) & placed
    is_free = (code == _FREE) & placed
    key = chunk * (1 << 44) + np.where(placed, offset, 0)

    # items on a key (chunk, offset): closes sort before opens at the same event. A reuse closes
    # the parent's lifetime and opens the node's on the same bytes; a head free_extra right after
    # it closes the node's and reopens it without the tail it gave back.
    reuse_at = idx[is_reuse]
    fe = idx[(code == _FREE_EXTRA) & placed]
    fe_r = np.zeros(0, dtype=np.int64)
    if len(fe) and len(reuse_at):
        pos = np.searchsorted(reuse_at, fe, side="right") - 1
        ok = pos >= 0
        fe, fe_r = fe[ok], reuse_at[pos[ok]]
        same = chunk[fe_r] == chunk[fe]
        fe, fe_r = fe[same], fe_r[same]
    else:
        fe = fe[:0]
    item_i, item_src, item_open, own, item_key = lifetime_items(idx[is_free | is_reuse], fe, fe_r,
                                                                idx[is_alloc | is_reuse], is_alloc, size, offset, key)
    order = np.lexsort((item_open, item_i, item_key))
    item_i, item_src, item_open, item_key, own = (item_i[order], item_src[order], item_open[order],
                                                  item_key[order], own[order])

    # a reuse has no size of its own: forward-fill the last known open size on the same key
    m = len(item_i)
    known = np.where(own != MISSING, np.arange(m), -1)
    np.maximum.accumulate(known, out=known)
    good = known >= 0
    good[good] &= item_key[known[good]] == item_key[good]
    item_size = np.where(good & item_open, own[np.maximum(known, 0)], MISSING)

    # an open ends at the next item on the same bytes (a close, or an overwrite), else at the end
    nxt = np.full(m, n, dtype=np.int64)
    if m > 1:
        same_next = item_key[1:] == item_key[:-1]
        nxt[:-1] = np.where(same_next, item_i[1:], n)
    sel = item_open & (item_size > 0)
    start, end, size_o, src = item_i[sel], nxt[sel], item_size[sel], item_src[sel]
    realloc = idx[code == _REALLOC]
    if len(realloc):
        k = np.searchsorted(realloc, start, side="right")
        cut = k < len(realloc)
        end[cut] = np.minimum(end[cut], realloc[k[cut]])

    off_o, chunk_o = offset[src], chunk[src]
    chunks, bases = _stack_chunks(chunk_o, off_o + size_o)
    y0 = bases[chunk_o] + off_o if len(start) else off_o
    used = _used_bytes(n, start, end, size_o)
    return Lifetimes(n, start, end, y0, y0 + size_o, off_o, size_o, chunk_o, tensor[src], op[src], chunks, used,
                     _forward_fill(int_column(cols.get("n_free"), n)),
                     _forward_fill(int_column(cols.get("largest_free"), n)),
                     _forward_fill(int_column(cols.get("total_free"), n)))


def _place_reuses(kind, tensor, parent, view_src, offset, chunk):
    """Imported head logs name a reuse's parent but not its bytes: find where the parent (or its
    view source) lives at that moment. One pass over the placing and freeing events only."""
    where: dict = {}
    live: set = set()
    for i in np.flatnonzero(np.isin(kind, ("alloc", "reuse", "free", "realloc"))).tolist():
        k = kind[i]
        if k == "realloc":
            where.clear()
            live.clear()
            continue
        if k == "reuse" and offset[i] == MISSING:
            for name in (parent[i], view_src[i]):
                key = where.get(name)
                if key is not None and key in live:
                    chunk[i], offset[i] = key
                    break
        if offset[i] == MISSING:
            continue
        key = (int(chunk[i]), int(offset[i]))
        if k == "free":
            live.discard(key)
        else:
            live.add(key)
            where[tensor[i]] = key


def _stack_chunks(chunk: np.ndarray, top: np.ndarray):
    """Chunks one above the other: each starts where the previous one's highest byte ends."""
    if not len(chunk):
        return [], np.zeros(1, dtype=np.int64)
    n_chunks = int(chunk.max()) + 1
    extent = np.zeros(n_chunks, dtype=np.int64)
    np.maximum.at(extent, chunk, top)
    bases = np.concatenate([[0], np.cumsum(extent)[:-1]]).astype(np.int64)
    info = [{"chunk": c, "base": int(bases[c]), "extent": int(extent[c])} for c in range(n_chunks) if extent[c]]
    return info, bases


def _used_bytes(n: int, start, end, size) -> np.ndarray:
    if n == 0:
        return np.zeros(0)
    w = size.astype(np.float64)
    delta = np.bincount(start, weights=w, minlength=n + 1) - np.bincount(end, weights=w, minlength=n + 1)
    return np.cumsum(delta)[:n]


# --- view windows ---------------------------------------------------------------------------------

def _centres(x0c, x1c, y0c, y1c, win) -> tuple[np.ndarray, np.ndarray]:
    """Each shape's clipped centre as a fraction of the window, per axis."""
    wx0, wx1, wy0, wy1 = win
    cx = (x0c + x1c - 2 * wx0) * (0.5 / (wx1 - wx0))
    cy = (y0c + y1c - 2 * wy0) * (0.5 / (wy1 - wy0))
    return cx, cy


def _cells(centres, g: int) -> np.ndarray:
    """Grid cell of each centre on a g x g grid over the window."""
    cx, cy = centres
    ix = np.minimum((cx * g).astype(np.int64), g - 1)
    iy = np.minimum((cy * g).astype(np.int64), g - 1)
    ix *= g
    ix += iy
    return ix


def _grid_for(x0c, x1c, y0c, y1c, win, max_shapes: int):
    """The finest grid (up to GRID per axis, from about 64 cells per allowed shape) whose
    occupied cells fit in max_shapes."""
    g = min(GRID, max(1, math.isqrt(max_shapes * 64)))
    centres = _centres(x0c, x1c, y0c, y1c, win)
    stride = len(centres[0]) // (8 * max_shapes)
    if stride > 1:  # many shapes: a sample occupies no more cells than all of them, so the grid it
        # settles on is never coarser than the answer; start there instead of at the finest grid
        g = _settle((centres[0][::stride], centres[1][::stride]), g, max_shapes)[0]
    return _settle(centres, g, max_shapes)


def _settle(centres, g: int, max_shapes: int):
    while True:
        cells = _cells(centres, g)
        if g * g <= max_shapes:
            return g, cells
        occupied = _count_occupied(cells, g)
        if occupied <= max_shapes:
            return g, cells
        g = max(1, min(g - 1, int(g / math.sqrt(occupied / max_shapes))))


def _count_occupied(cells: np.ndarray, g: int) -> int:
    """len(_occupied(cells, g)[0]) without numbering the groups: the grid search only counts, and
    marking cells in a g*g bitmap (at most GRID**2 bytes) is cheaper than sorting or counting them."""
    seen = np.zeros(g * g, dtype=bool)
    seen[cells] = True
    return int(np.count_nonzero(seen))


def _occupied(cells: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """(occupied cells in ascending order, each centre's group: its cell's position among them).
    Few centres on a big grid are sorted; many are counted per cell."""
    if len(cells) * 16 < g * g:
        return np.unique(cells, return_inverse=True)
    occupied = np.flatnonzero(np.bincount(cells, minlength=g * g))
    dense = np.zeros(g * g, dtype=np.int64)
    dense[occupied] = np.arange(len(occupied))
    return occupied, dense[cells]


def window_shapes(lt: Lifetimes, win, max_shapes: int) -> dict:
    """Shapes in the window, at most max_shapes: exact when they fit, else merged per grid cell
    (bounding box of the members, `n` how many, `tensor`/`size` of the largest member)."""
    cols, total, merged = shape_columns(lt, win, max_shapes)
    names = list(cols)
    rows = [dict(zip(names, r)) for r in zip(*(cols[k] for k in names))]
    return {"shapes": rows, "count": len(rows), "total_in_view": total, "reduced": merged}


def with_lod(lt: Lifetimes) -> Lifetimes:
    """`lt` with its tile pyramid built (memmap_lod.py): windows are then answered from it."""
    from . import memmap_lod
    if lt.lod is None:
        lt.lod = memmap_lod.build(lt)
    return lt


def shape_columns(lt: Lifetimes, win, max_shapes: int, vis: np.ndarray | None = None) -> tuple[dict, int, bool]:
    """window_shapes as columns (name -> list of Python values): (columns, total in view, merged).
    `vis`: the lifetimes in view, in index order, when the caller found them already."""
    if vis is None and lt.lod is not None:
        from . import memmap_lod
        return memmap_lod.shape_columns(lt, lt.lod, win, max_shapes)
    wx0, wx1, wy0, wy1 = win
    if vis is None:
        vis = lt.in_window(win)
    total = len(vis)
    if total <= max_shapes:
        sel = vis
        cols = {"x0": lt.start[sel], "x1": lt.end[sel], "y0": lt.y0[sel], "y1": lt.y1[sel],
                "n": np.ones(len(sel), dtype=np.int64), "tensor": lt.tensor[sel], "op": lt.op[sel],
                "size": lt.size[sel],
                "offset": lt.offset[sel], "chunk": lt.chunk[sel]}
        return {k: v.tolist() for k, v in cols.items()}, total, False
    if total == len(lt.start):  # everything is in view: no copies
        vis, s, e, a, b = slice(None), lt.start, lt.end, lt.y0, lt.y1
    else:
        s, e, a, b = lt.start[vis], lt.end[vis], lt.y0[vis], lt.y1[vis]
    clip = (np.maximum(s, wx0), np.minimum(e, wx1), np.maximum(a, wy0), np.minimum(b, wy1))
    g, cells = _grid_for(*clip, win, max_shapes)
    occupied, group = _occupied(cells, g)  # occupied cells get dense group numbers, in cell order
    k = len(occupied)
    counts = np.bincount(group, minlength=k)

    def reduce(fn, values, init):
        out = np.full(k, init, dtype=values.dtype)
        fn.at(out, group, values)
        return out

    big = np.iinfo(np.int64).max
    # the largest visible member of each group: the first position holding its group's maximum
    area = (clip[1] - clip[0]).astype(np.float64) * (clip[3] - clip[2]).astype(np.float64)
    top = reduce(np.maximum, area, -1.0)
    pos = np.where(area == top[group], np.arange(len(area)), big)
    members = vis if isinstance(vis, np.ndarray) else np.arange(len(lt.start))  # vis: indices, or all
    biggest = members[reduce(np.minimum, pos, big)]
    cols = {"x0": reduce(np.minimum, s, big), "x1": reduce(np.maximum, e, -1),
            "y0": reduce(np.minimum, a, big), "y1": reduce(np.maximum, b, -1),
            "n": counts, "tensor": lt.tensor[biggest], "op": lt.op[biggest], "size": lt.size[biggest],
            "offset": lt.offset[biggest], "chunk": lt.chunk[biggest]}
    return {k: v.tolist() for k, v in cols.items()}, total, True


def _nan_list(a: np.ndarray) -> list:
    return [None if v != v else int(v) for v in a.tolist()]


def window_series(lt: Lifetimes, x0: int, x1: int, max_points: int) -> tuple[list, int]:
    """Free-list summary and used bytes over events [x0, x1) as at most max_points rows; a row
    stands for a bucket of events starting at `x` and keeps its worst case (most used, most
    blocks, smallest largest-free and total-free). Returns (rows, bucket width)."""
    cols, step = series_columns(lt, x0, x1, max_points)
    names = list(cols)
    return [dict(zip(names, r)) for r in zip(*(cols[k] for k in names))], step


def series_columns(lt: Lifetimes, x0: int, x1: int, max_points: int) -> tuple[dict, int]:
    """window_series as columns (name -> list of ints, None where unknown): (columns, bucket width)."""
    if lt.lod is not None:
        from . import memmap_lod
        return memmap_lod.series_columns(lt, lt.lod, x0, x1, max_points)
    x0, x1 = max(0, x0), min(lt.n_events, x1)
    if x1 <= x0:
        return {k: [] for k in ("x", "used", "n_free", "largest_free", "total_free")}, 1
    step = max(1, math.ceil((x1 - x0) / max_points))
    heads = np.arange(x0, x1, step)
    rel = heads - x0

    def red(arr, fn):
        return _nan_list(fn.reduceat(arr[x0:x1], rel) if step > 1 else arr[x0:x1])

    cols = {"x": heads.tolist(), "used": red(lt.used, np.fmax), "n_free": red(lt.n_free, np.fmax),
            "largest_free": red(lt.largest_free, np.fmin), "total_free": red(lt.total_free, np.fmin)}
    return cols, step


# --- cache ----------------------------------------------------------------------------------------

class LRU:
    """Built values per key (e.g. (trace id, graph)), least recently used dropped first; a value
    is built once even when many requests ask for it at the same time."""

    def __init__(self, max_entries: int = 8):
        self.max_entries = max_entries
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict = {}

    def get(self, key, build):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            gate = self._building.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._items:
                    return self._items[key]
            try:
                value = build()
                with self._lock:
                    self._items[key] = value
                    while len(self._items) > self.max_entries:
                        self._items.popitem(last=False)
            finally:
                with self._lock:
                    self._building.pop(key, None)
            return value

    def peek(self, key):
        """The value if it is built already (marked as used), else None; never builds."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def drop(self, trace_id: str):
        """Forget every entry of a trace (keys are (trace id, ...))."""
        with self._lock:
            for k in [k for k in self._items if k[0] == trace_id]:
                del self._items[k]

    def keep_traces(self, trace_ids: set):
        """Forget the entries of traces not in `trace_ids` (deleted by another process)."""
        with self._lock:
            for k in [k for k in self._items if k[0] not in trace_ids]:
                del self._items[k]


def window(lt: Lifetimes, info: dict, x0, x1, y0, y1) -> tuple[int, int, int, int]:
    """The view window with defaults filled in: the whole graph, up to the highest byte any
    tensor, max_size or buffer_size reaches."""
    top = max(lt.y_extent, info.get("max_size") or 0, info.get("buffer_size") or 0, 1)
    win = (0 if x0 is None else x0, max(lt.n_events, 1) if x1 is None else x1,
           0 if y0 is None else y0, top if y1 is None else y1)
    if win[1] <= win[0]:
        raise UserError(f"empty event range: x1 ({win[1]}) must be above x0 ({win[0]})")
    if win[3] <= win[2]:
        raise UserError(f"empty address range: y1 ({win[3]}) must be above y0 ({win[2]})")
    return win
