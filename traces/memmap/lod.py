"""Level of detail for the memory map: a tile pyramid built once per graph, so a wide view
window is a few lookups and slices instead of a reduction over every lifetime.

Tiles: level k cuts the graph's event axis and its address axis (0 .. the highest byte)
into 2**k parts each; a lifetime belongs to the tile holding its centre. Per level, each
occupied tile keeps the bounding box of its members, how many there are and its largest
member (by duration x bytes; the first one on ties). The finest level kept, the counting
level (the finest with at most COUNT_TILES occupied tiles), also keeps its members grouped
by tile, so a window's lifetimes are counted exactly: tiles inside the window count
whole, only the members of tiles on its border are tested one by one. Its tiles are also
indexed by event column, with each column's event extent, so a zoomed window tests only
the tiles of the columns that reach into it.

A window answer (see `shape_columns`) is exact when at most max_shapes lifetimes are in
view (the same lifetimes, in the same order, as view.shape_columns gives), else the
tiles of the finest level with at most max_shapes tiles in view: bounding box and largest
member of the whole tile, `n` its members in view. The free-list series keeps its worst
cases per power-of-two bucket of events, precomputed per bucket width (`series_columns`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from alloctrace.traces.memmap.lifetimes import _nan_list

COUNT_TILES = 1 << 14  # occupied tiles at the counting level: the border scan stays small
MAX_LEVEL = 10  # 1024 x 1024 tiles at most
FEW = 4  # a reduced answer with fewer than max_shapes / FEW tiles is regridded over the window instead
REGRID = 8  # ... when at most REGRID x max_shapes lifetimes are in view


@dataclass
class Level:
    key: np.ndarray  # tile keys (x * 2**level + y), sorted
    x0: np.ndarray  # bounding box of all members
    x1: np.ndarray
    y0: np.ndarray
    y1: np.ndarray
    biggest: np.ndarray  # lifetime index of the largest member
    count: np.ndarray  # members
    up: np.ndarray  # counting-level tile -> row here


@dataclass
class Pyramid:
    levels: list  # coarsest first; the last is the counting level
    members: np.ndarray  # lifetime indices grouped by counting-level tile (rows in key order)
    first: np.ndarray  # members[first[r]:first[r + 1]] belong to counting-level row r
    series: list  # series[k]: (used, n_free, largest_free, total_free) per bucket of 2**k events
    columns: tuple  # counting-level tiles by event column: (first row per column + end, lowest x0, highest x1)
    faces: dict = field(default_factory=dict)  # what a face derives once from the pyramid (the server's JSON rows)


def build(lt) -> Pyramid:
    """The pyramid of a graph's Lifetimes (lifetimes.Lifetimes)."""
    n = len(lt.start)
    top = max(lt.y_extent, 1)
    xs, ys = max(lt.n_events, 1), top
    area = (lt.end - lt.start).astype(np.float64) * lt.size.astype(np.float64)
    # tile coordinates at the finest level, then the counting level is the finest that stays small
    g = 1 << MAX_LEVEL
    fx = np.minimum(((lt.start + lt.end) * (g / (2 * xs))).astype(np.int64), g - 1) if n else np.zeros(0, np.int64)
    fy = np.minimum(((lt.y0 + lt.y1) * (g / (2 * ys))).astype(np.int64), g - 1) if n else np.zeros(0, np.int64)
    level = MAX_LEVEL
    while level > 0 and _occupied(fx >> (MAX_LEVEL - level), fy >> (MAX_LEVEL - level), level) > COUNT_TILES:
        level -= 1
    s = MAX_LEVEL - level
    cx, cy = fx >> s, fy >> s
    key = cx * (1 << level) + cy
    order = np.lexsort((np.arange(n), key))  # by tile, members in index order
    skey = key[order]
    starts = np.flatnonzero(np.concatenate([[True], skey[1:] != skey[:-1]])) if n else np.zeros(0, np.int64)
    first = np.append(starts, n).astype(np.int64)
    tiles = skey[starts]
    tx, ty = tiles >> level, tiles & ((1 << level) - 1)

    def reduce(fn, values):
        return fn.reduceat(values[order], starts) if n else values[:0]

    # largest member per counting tile: max area, then the smallest index (members are in index order)
    best_area = reduce(np.maximum, area)
    row_of = np.repeat(np.arange(len(starts)), np.diff(first))
    pos = np.where(area[order] == best_area[row_of], np.arange(n), n)
    biggest = order[np.minimum.reduceat(pos, starts)] if n else np.zeros(0, np.int64)
    finest = Level(tiles, reduce(np.minimum, lt.start), reduce(np.maximum, lt.end), reduce(np.minimum, lt.y0),
                   reduce(np.maximum, lt.y1), biggest, np.diff(first), np.arange(len(tiles)))
    levels = [finest]
    for k in range(level - 1, -1, -1):  # coarser and coarser, each from the counting level
        bx, by = tx >> (level - k), ty >> (level - k)
        ckey = bx * (1 << k) + by
        pkey, up = np.unique(ckey, return_inverse=True)
        # the largest member of a tile: the largest of its sub-tiles' largest, smallest index on ties
        sub_area = area[finest.biggest]
        best = np.full(len(pkey), -1.0)
        np.maximum.at(best, up, sub_area)
        cand = np.where(sub_area == best[up], finest.biggest, n)
        big = np.full(len(pkey), n, dtype=np.int64)
        np.minimum.at(big, up, cand)
        k_tiles, top_int = len(pkey), np.iinfo(np.int64).max
        lv = Level(pkey, _at(np.minimum, up, finest.x0, k_tiles, top_int), _at(np.maximum, up, finest.x1, k_tiles, -1),
                   _at(np.minimum, up, finest.y0, k_tiles, top_int), _at(np.maximum, up, finest.y1, k_tiles, -1),
                   big, np.bincount(up, weights=finest.count, minlength=k_tiles).astype(np.int64), up)
        levels.append(lv)
    n_cols = 1 << level
    col_x0, col_x1 = np.full(n_cols, np.iinfo(np.int64).max), np.full(n_cols, -1, dtype=np.int64)
    np.minimum.at(col_x0, tx, finest.x0)
    np.maximum.at(col_x1, tx, finest.x1)
    columns = (np.searchsorted(tx, np.arange(n_cols + 1)), col_x0, col_x1)
    return Pyramid(levels[::-1], order, first, _series_levels(lt), columns)


def _occupied(x: np.ndarray, y: np.ndarray, level: int) -> int:
    """Occupied tiles of a level, counted per tile (at most 4**MAX_LEVEL counters)."""
    return int(np.count_nonzero(np.bincount(x * (1 << level) + y, minlength=1 << (2 * level))))


def _at(fn, up, values, k, init):
    out = np.full(k, init, dtype=values.dtype)
    fn.at(out, up, values)
    return out


def _series_levels(lt) -> list:
    """Worst cases per aligned bucket of 2**k events, k = 0 (the events themselves) upwards."""
    cur = (lt.used, lt.n_free, lt.largest_free, lt.total_free)
    out = [cur]
    while len(cur[0]) > 1:
        cur = tuple(_pairs(fn, a) for a, fn in zip(cur, (np.fmax, np.fmax, np.fmin, np.fmin)))
        out.append(cur)
    return out


def _pairs(fn, a: np.ndarray) -> np.ndarray:
    """fn over each aligned pair of `a` (a last odd one kept): fn.reduceat(a, arange(0, len, 2)), faster."""
    m = len(a)
    out = np.empty((m + 1) // 2, dtype=a.dtype)
    fn(a[0:m - 1:2], a[1::2], out=out[:m // 2])
    if m % 2:
        out[-1] = a[-1]
    return out


def _ranges(first: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions first[r] .. first[r + 1] - 1 of every row r in rows, concatenated."""
    lo, hi = first[rows], first[rows + 1]
    lengths = hi - lo
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return shift + np.arange(total)


@dataclass
class Tiles:
    """A reduced window answer: rows of one level, with how many of each tile's members are in view."""

    level: int  # index into Pyramid.levels
    rows: np.ndarray
    n: np.ndarray  # members in view, per row


def answer(lt, pyr: Pyramid, win, max_shapes: int) -> tuple[Tiles | np.ndarray, int]:
    """(Tiles, or the lifetimes to reduce or show as view.shape_columns would, in index order;
    lifetimes in view)."""
    wx0, wx1, wy0, wy1 = win
    cl = pyr.levels[-1]
    rows = _rows_near(pyr, wx0, wx1)
    x0, x1, y0, y1 = (cl.x0, cl.x1, cl.y0, cl.y1) if rows is None else \
        (cl.x0[rows], cl.x1[rows], cl.y0[rows], cl.y1[rows])
    overlap = (x0 < wx1) & (x1 > wx0) & (y0 < wy1) & (y1 > wy0)
    inside = overlap & (x0 >= wx0) & (x1 <= wx1) & (y0 >= wy0) & (y1 <= wy1)
    inside_rows, border = np.flatnonzero(inside), np.flatnonzero(overlap & ~inside)
    if rows is not None:
        inside_rows, border = rows[inside_rows], rows[border]
    cand = pyr.members[_ranges(pyr.first, border)]  # members of border tiles: tested one by one
    hit = (lt.start[cand] < wx1) & (lt.end[cand] > wx0) & (lt.y0[cand] < wy1) & (lt.y1[cand] > wy0)
    in_view = np.zeros(len(cl.key), dtype=np.int64)
    in_view[inside_rows] = cl.count[inside_rows]
    if len(border):
        in_view[border] = np.add.reduceat(hit.astype(np.int64),
                                          np.concatenate([[0], np.cumsum(cl.count[border])[:-1]]))
    total = int(in_view.sum())

    def visible():
        sel = np.concatenate([pyr.members[_ranges(pyr.first, inside_rows)], cand[hit]])
        sel.sort()
        return sel

    if total <= max_shapes:  # exact: the lifetimes in view
        return visible(), total
    nz = np.flatnonzero(in_view)
    best = Tiles(len(pyr.levels) - 1, nz, in_view[nz])
    for i in range(len(pyr.levels) - 2, -1, -1):  # finest first: tiles in view only get fewer going coarser
        if len(best.rows) <= max_shapes:
            break
        lv = pyr.levels[i]
        counts = np.bincount(lv.up[nz], weights=in_view[nz], minlength=len(lv.key)).astype(np.int64)
        rows = np.flatnonzero(counts)
        best = Tiles(i, rows, counts[rows])
    if len(best.rows) * FEW < max_shapes and total <= REGRID * max_shapes:
        return visible(), total  # zoomed far in: the tiles are coarse here; a grid over the window shows more
    return best, total


def _rows_near(pyr: Pyramid, wx0: int, wx1: int) -> np.ndarray | None:
    """Counting-level rows of the event columns whose tiles reach into events [wx0, wx1), ascending;
    None when that is most of them (then every row is tested)."""
    first, col_x0, col_x1 = pyr.columns
    cols = np.flatnonzero((col_x0 < wx1) & (col_x1 > wx0))
    if len(cols) * 2 > len(col_x0):
        return None
    return _ranges(first, cols)


def tile_columns(lt, lv: Level, rows: np.ndarray, n: np.ndarray) -> dict:
    b = lv.biggest[rows]
    cols = {"x0": lv.x0[rows], "x1": lv.x1[rows], "y0": lv.y0[rows], "y1": lv.y1[rows], "n": n,
            "tensor": lt.tensor[b], "op": lt.op[b], "size": lt.size[b], "offset": lt.offset[b], "chunk": lt.chunk[b]}
    return {k: v.tolist() for k, v in cols.items()}


def series_range(lt, pyr: Pyramid, x0: int, x1: int, max_points: int) -> tuple[int, int, int] | None:
    """(k, first bucket, end bucket) of the series over events [x0, x1); None when empty."""
    x0, x1 = max(0, x0), min(lt.n_events, x1)
    if x1 <= x0:
        return None
    k = max(0, int(math.log2(max(1.0, (x1 - x0) / max_points))))
    while k < len(pyr.series) - 1 and ((x1 - 1) >> k) - (x0 >> k) + 1 > max_points:  # never more rows than asked
        k += 1
    return k, x0 >> k, ((x1 - 1) >> k) + 1


def series_columns(lt, pyr: Pyramid, x0: int, x1: int, max_points: int) -> tuple[dict, int]:
    """The free-list series over events [x0, x1) in at most max_points rows: buckets of a
    power-of-two width, aligned to multiples of it (the first may start before x0), each
    keeping its worst case. Returns (columns, bucket width)."""
    got = series_range(lt, pyr, x0, x1, max_points)
    if got is None:
        return {k: [] for k in ("x", "used", "n_free", "largest_free", "total_free")}, 1
    k, lo, hi = got
    used, n_free, largest, total = (a[lo:hi] for a in pyr.series[k])
    cols = {"x": (np.arange(lo, hi) << k).tolist(), "used": _nan_list(used),
            "n_free": _nan_list(n_free), "largest_free": _nan_list(largest),
            "total_free": _nan_list(total)}
    return cols, 1 << k
