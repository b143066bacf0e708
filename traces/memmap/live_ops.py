"""The op of each live tensor at an event, without building the graph's lifetimes.

The state view colours a live tensor by the op of its lifetime on the memory map
(`memmap.extract`): the lifetime on the same bytes (chunk, offset) that is open
after the first `applied` events, if it names the same tensor. That lifetime is
decided by the last placing or releasing event on those bytes before `applied`
(and the last one that sized them), so only the events on the live tensors'
bytes are sorted here (extract sorts all of them), and only the last events
before `applied`: 8,192 first, eight times more each time some live bytes were
not sized among them. A state late in a million-event graph whose live tensors
are recent reads a few thousand rows of four integer columns, then the tensor
and op of a handful of events. `tests/state/test_state_cold.py` compares it with the
lifetimes at every event of the real fixture logs and of synthetic graphs.
"""
from __future__ import annotations

from itertools import repeat

import numpy as np

from alloctrace.traces.store.columns_lazy import LazyColumns
from alloctrace.traces.memmap.lifetimes import (_ALLOC, _FREE, _FREE_EXTRA, _KIND_CODES, _REALLOC, _REUSE, MISSING, int_column, lifetime_items,
                     str_column)


FIRST_WINDOW = 1 << 13  # events looked at first; eight times more each time that is not enough


def name_live_ops_from_lifetimes(live: list[dict], lt, applied: int):
    """Give each live tensor the op of its lifetime when the graph's lifetimes are at hand (the memory map
    built them): the lifetime open after `applied` events on the same bytes."""
    if not live or not len(lt.start):
        return
    alive = np.flatnonzero((lt.start < applied) & (lt.end >= applied))
    ops = {(lt.tensor[k], int(lt.chunk[k]), int(lt.offset[k])): lt.op[k] for k in alive.tolist()}
    for t in live:
        op = ops.get((t.get("tensor"), t.get("chunk") or 0, t.get("offset")))
        if op:
            t["op"] = op


def name_live_ops(live: list[dict], cols, applied: int) -> bool:
    """Give each live tensor (Replay.state()["live"] after `applied` events) the op of its lifetime,
    as extract's lifetimes would. Looks at the last events first, then further back, until every live
    tensor's bytes have an event that sized them there (see `_alive`). False, with nothing named, when
    a reuse among those events names its parent without an offset (extract places those with a
    replay of names from the start): ask the lifetimes then."""
    if not live:
        return True
    wanted = np.unique(np.array([(t.get("chunk") or 0) * (1 << 44) + t["offset"] for t in live], dtype=np.int64))
    width = FIRST_WINDOW
    while (src := _alive(cols, max(0, applied - width), applied, wanted)) is None:
        width *= 8
    if src is False:
        return False
    if len(src):
        tensors, ops = _objects(cols, "tensor", src), _objects(cols, "op", src)
        chunk = np.maximum(_ints(cols, "chunk", src), 0).tolist()
        by_key = {(t, c, o): op for t, c, o, op in zip(tensors, chunk, _ints(cols, "offset", src).tolist(), ops)}
        for t in live:
            op = by_key.get((t.get("tensor"), t.get("chunk") or 0, t.get("offset")))
            if op:
                t["op"] = op
    return True


def _alive(cols, lo: int, n: int, wanted: np.ndarray):
    """The events (indices) that opened the lifetimes on the `wanted` bytes (extract's keys) that are
    open after n events, from events lo..n-1 only; None when those are not enough to tell (lo > 0 and
    some wanted bytes have no sizing event among them, or a free_extra no reuse before it), False
    when a reuse among them has no offset.

    extract's items on given bytes, sorted by event, decide the lifetime open after n: the last one,
    if it opens one with a size (forward-filled from the last item on the same bytes that has one)
    and no realloc came after it. So a suffix of the events holding a sized item on every wanted key
    gives the same answer as all of them."""
    code = _kind_codes(cols, lo, n)
    offset = _ints(cols, "offset", slice(lo, n))
    if np.any((code == _REUSE) & (offset == MISSING)):
        return False
    chunk = np.maximum(_ints(cols, "chunk", slice(lo, n)), 0)
    size = _ints(cols, "size", slice(lo, n))
    idx = np.arange(n - lo, dtype=np.int64)  # positions in the window: event lo + position
    placed = offset != MISSING
    is_alloc, is_reuse = (code == _ALLOC) & placed, (code == _REUSE) & placed
    key = chunk * (1 << 44) + np.where(placed, offset, 0)
    buckets = np.zeros(1 << 16, dtype=bool)
    buckets[_bucket(wanted)] = True

    def on_live_bytes(keys):  # a hash on the whole array, then an exact look at the few that hit
        hit = np.flatnonzero(buckets[_bucket(keys)])
        pos = np.minimum(np.searchsorted(wanted, keys[hit]), len(wanted) - 1)
        out = np.zeros(len(keys), dtype=bool)
        out[hit[wanted[pos] == keys[hit]]] = True
        return out

    # the items extract sorts, in its order, of the wanted bytes only
    reuse_at = idx[is_reuse]
    fe = idx[(code == _FREE_EXTRA) & placed]
    fe_r = np.zeros(0, dtype=np.int64)
    if len(fe):
        pos = np.searchsorted(reuse_at, fe, side="right") - 1
        ok = pos >= 0
        if lo > 0 and not ok.all():  # its reuse is further back
            return None
        fe, fe_r = fe[ok], reuse_at[pos[ok]]
        same = chunk[fe_r] == chunk[fe]
        fe, fe_r = fe[same], fe_r[same]
    mine = on_live_bytes(key[fe_r])
    fe, fe_r = fe[mine], fe_r[mine]
    live = on_live_bytes(key)
    item_i, item_src, item_open, own, item_key = lifetime_items(
        idx[(((code == _FREE) & placed) | is_reuse) & live], fe, fe_r, idx[(is_alloc | is_reuse) & live],
        is_alloc, size, offset, key)
    if lo > 0 and not np.isin(wanted, item_key[own != MISSING]).all():
        return None
    order = np.lexsort((item_open, item_i, item_key))
    item_i, item_src, item_open, item_key, own = (item_i[order], item_src[order], item_open[order],
                                                  item_key[order], own[order])
    m = len(item_i)
    if not m:
        return item_src
    known = np.where(own != MISSING, np.arange(m), -1)
    np.maximum.accumulate(known, out=known)
    good = known >= 0
    good[good] &= item_key[known[good]] == item_key[good]
    item_size = np.where(good & item_open, own[np.maximum(known, 0)], MISSING)
    last = np.ones(m, dtype=bool)
    last[:-1] = item_key[1:] != item_key[:-1]
    realloc = idx[code == _REALLOC]
    after = int(realloc[-1]) if len(realloc) else -1
    return lo + item_src[last & item_open & (item_size > 0) & (item_i > after)]


def _bucket(keys: np.ndarray) -> np.ndarray:
    """16 well-mixed bits of each key (offsets are aligned: their low bits are mostly zero)."""
    return ((keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(48)).astype(np.intp)


def _kind_codes(cols, lo: int, n: int) -> np.ndarray:
    """extract's kind codes of events lo..n-1 (from the stored string codes when the columns are lazy)."""
    if isinstance(cols, LazyColumns):
        lut = np.zeros(len(cols.table) + 1, dtype=np.int8)  # the last entry: code -1 (no kind)
        present = cols.codes("kind")
        for k, c in _KIND_CODES.items():
            if k in present:
                lut[present[k]] = c
        return lut[cols.raw("kind")[lo:n]]
    kind = cols["kind"][lo:n]
    return np.fromiter(map(_KIND_CODES.get, kind, repeat(0)), dtype=np.int8, count=n - lo)


def _ints(cols, name: str, rows) -> np.ndarray:
    col = cols.get(name)
    n = len(cols["kind"])
    count = len(range(*rows.indices(n))) if isinstance(rows, slice) else len(rows)
    return int_column(None if col is None else col[rows], count)


def _objects(cols, name: str, rows: np.ndarray) -> list:
    col = cols.get(name)
    return [None] * len(rows) if col is None else str_column(col[rows], len(rows)).tolist()
