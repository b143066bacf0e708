"""The memory map of one graph: tensor lifetimes as rectangles, reduced to what a screen can show.

A lifetime runs from the event that placed a tensor (`alloc`, or `reuse` of its
parent's bytes) to the event that gave the bytes back (`free`, the next reuse of
the same bytes, a head `realloc`) or to the end of the graph. Its height is the
tensor's address range; views have none of their own and are left out. Every
step is numpy over whole columns, so a million-event graph is extracted once
(and cached); view.py cuts and reduces a view window of them in milliseconds.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

MISSING = -1


def int_column(col, n: int) -> np.ndarray:
    """A column as int64 with MISSING for absent values, whatever the store's encoding
    (ints, floats with NaN, masked arrays, objects with None)."""
    if col is None:
        return np.full(n, MISSING, dtype=np.int64)
    ma = sys.modules.get("numpy.ma")  # a masked array exists only once numpy.ma is imported (45 ms: not here)
    if ma is not None and isinstance(col, ma.MaskedArray):
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


def _nan_list(a: np.ndarray) -> list:
    return [None if v != v else int(v) for v in a.tolist()]
