"""A view window of the memory map: the lifetimes in it, merged per grid cell when there are more than a screen
shows, and the free-list series over its events, bucketed.

Without a tile pyramid (lod.py) the answer is reduced from the lifetimes in view; with one, from its tiles
(`with_lod`), or from the lifetimes the pyramid picks when the view is zoomed in.
"""
from __future__ import annotations

import math

import numpy as np

from alloctrace.traces.errors import UserError
from alloctrace.traces.memmap import lod
from alloctrace.traces.memmap.lifetimes import Lifetimes, _nan_list

GRID = 1024  # finest bucket grid per axis: about one cell per screen pixel


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
    """`lt` with its tile pyramid built (lod.py): windows are then answered from it."""
    if lt.lod is None:
        lt.lod = lod.build(lt)
    return lt


def shape_columns(lt: Lifetimes, win, max_shapes: int, vis: np.ndarray | None = None) -> tuple[dict, int, bool]:
    """window_shapes as columns (name -> list of Python values): (columns, total in view, merged).
    `vis`: the lifetimes in view, in index order, when the caller found them already."""
    if vis is None and lt.lod is not None:
        return pyramid_shape_columns(lt, lt.lod, win, max_shapes)
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


def pyramid_shape_columns(lt: Lifetimes, pyr: lod.Pyramid, win, max_shapes: int) -> tuple[dict, int, bool]:
    """shape_columns from the pyramid: (columns, lifetimes in view, reduced)."""
    got, total = lod.answer(lt, pyr, win, max_shapes)
    if isinstance(got, lod.Tiles):
        return lod.tile_columns(lt, pyr.levels[got.level], got.rows, got.n), total, True
    return shape_columns(lt, win, max_shapes, vis=got)


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
        return lod.series_columns(lt, lt.lod, x0, x1, max_points)
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
