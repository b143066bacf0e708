"""Line up two graphs' placements (allocations and inplace reuses) by tensor identity.

A placement's identity is its tensor name plus how many placements of that name
came before it in the same graph, so `tmpk` of layer 3 meets `tmpk` of layer 3
whatever the sizes. Unnamed tensors share the name "" and so meet by position
among the unnamed. Keys are matched with a sort (numpy), then the longest
order-consistent chain of matches is kept (a longest increasing subsequence),
so insertions, deletions and reorderings cost O(n log n), never O(n^2).
"""
from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter
from dataclasses import dataclass

import numpy as np

from alloctrace.allocator.events import KINDS

PLACEMENT_KINDS = {"alloc": 0, "reuse": 1, "oom": 2}  # oom: a failed allocation
KIND_NAMES = {v: k for k, v in PLACEMENT_KINDS.items()}
NONE = -1  # stands for a missing block/offset/chunk in the arrays


@dataclass
class Placements:
    """The placements of one graph, as parallel arrays (index = placement number)."""

    event: np.ndarray  # index into the event list
    kind: np.ndarray  # PLACEMENT_KINDS code
    block: np.ndarray
    offset: np.ndarray
    chunk: np.ndarray
    size: np.ndarray
    names: list  # tensor names
    parents: list  # reused parent for reuse placements, else None
    mutations: np.ndarray  # (n, 5): event, SCANNED code, chunk, offset, size of every free-list change
    mutation_names: list  # tensor of each mutation row
    mutation_links: dict  # mutation row of a reuse -> (parent, view_src)

    def __len__(self):
        return len(self.names)


SCANNED = {"alloc": 0, "free": 1, "free_extra": 2, "reuse": 3, "realloc": 4, "oom": 5}
_CODES = {**{k: -1 for k in KINDS}, **SCANNED}
_MUTATION_CODES = (0, 1, 2, 3, 4)
_PLACEMENT_OF_SCAN = {0: 0, 3: 1, 5: 2}  # scanned kind -> placement kind


def _ints(values) -> np.ndarray:
    """A column with None as NONE (through float: exact for anything below 2**53)."""
    col = np.array(values, dtype=np.float64)
    col[np.isnan(col)] = NONE
    return col.astype(np.int64)


def placements(events) -> Placements:
    """Extract placements and free-list changes in a few C-speed passes. `events` is a list of
    Event or a store's columns (`Store.columns`: int64 with -1 for missing, object strings)."""
    if isinstance(events, dict):
        return _from_columns(events)
    kinds = list(map(attrgetter("kind"), events))
    try:
        codes = np.fromiter(map(_CODES.__getitem__, kinds), dtype=np.int8, count=len(kinds))
    except KeyError:  # a kind this version does not know: the slow way
        codes = np.fromiter((SCANNED.get(k, -1) for k in kinds), dtype=np.int8, count=len(kinds))
    idx = np.flatnonzero(codes >= 0)
    sub = list(map(events.__getitem__, idx.tolist()))
    cols = {"tensor": np.array(list(map(attrgetter("tensor"), sub)) + [None], dtype=object)[:-1]}
    for name in ("size", "offset", "block", "chunk"):
        cols[name] = _ints(list(map(attrgetter(name), sub)))
    return _assemble(idx, codes[idx].astype(np.int64), cols, lambda r, name: getattr(sub[r], name))


def _from_columns(cols: dict) -> Placements:
    kinds = cols["kind"]
    codes = np.full(len(kinds), -1, dtype=np.int64)
    for k, code in SCANNED.items():
        codes[kinds == k] = code
    idx = np.flatnonzero(codes >= 0)
    sub = {"tensor": np.asarray(cols["tensor"], dtype=object)[idx]}
    for name in ("size", "offset", "block", "chunk"):
        sub[name] = cols[name][idx]

    def field(r, name):
        v = cols[name][idx[r]]
        return None if isinstance(v, (int, np.integer)) and v == NONE else v

    return _assemble(idx, codes[idx], sub, field)


def _assemble(idx, kind, cols, field) -> Placements:
    """The scanned rows (event numbers `idx`, SCANNED codes `kind`) as Placements. A legacy failed
    allocation (an alloc line with no offset, then oom) is one placement; a head oom with no alloc
    line before it is another. `field(row, name)` reads the rare extra fields."""
    names, size, offset, block, chunk = (cols[k] for k in ("tensor", "size", "offset", "block", "chunk"))
    size = size.copy()
    pkind = np.full(len(idx), -1, dtype=np.int8)
    for scanned, placed in _PLACEMENT_OF_SCAN.items():
        pkind[kind == scanned] = placed
    for r in np.flatnonzero(kind == 5).tolist():  # rare: out of space
        if r and kind[r - 1] == 0 and offset[r - 1] == NONE and idx[r - 1] == idx[r] - 1 and names[r - 1] == names[r]:
            pkind[r - 1], pkind[r] = 2, -1  # the alloc line before it was the failed attempt
        else:
            size[r] = field(r, "needed") or max(0, int(size[r]))
    is_mut = np.isin(kind, _MUTATION_CODES) & ~((kind == 0) & (offset == NONE))
    mut = np.stack([idx, kind, chunk, offset, size], axis=1)[is_mut]
    mut_at = np.flatnonzero(is_mut)
    links = {j: (field(r, "parent"), field(r, "view_src"))
             for j, r in zip(np.flatnonzero(kind[mut_at] == 3).tolist(), mut_at[kind[mut_at] == 3].tolist())}
    rows = np.flatnonzero(pkind >= 0)
    parents = [None] * len(rows)
    for j in np.flatnonzero(pkind[rows] == 1).tolist():
        parents[j] = field(int(rows[j]), "parent")
    placed_names = names[rows]
    placed_names[np.equal(placed_names, None)] = ""
    return Placements(idx[rows], pkind[rows], block[rows], offset[rows], chunk[rows], size[rows],
                      placed_names.tolist(), parents, mut, names[mut_at].tolist(), links)


def identity_keys(names: list, ids: dict) -> np.ndarray:
    """name id << 32 | occurrence of that name so far; `ids` is shared by both sides."""
    n = len(names)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    for x in dict.fromkeys(names):  # the distinct names, in C; only new ones get a number here
        if x not in ids:
            ids[x] = len(ids)
    name_id = np.fromiter(map(ids.__getitem__, names), dtype=np.int64, count=n)
    order = np.argsort(name_id, kind="stable")
    sorted_ids = name_id[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    occurrence = np.empty(n, dtype=np.int64)
    occurrence[order] = np.arange(n) - group_start
    return (name_id << 32) | occurrence


def longest_increasing(seq: np.ndarray) -> np.ndarray:
    """Indices of one longest strictly increasing subsequence of `seq` (patience sorting)."""
    n = len(seq)
    if n == 0 or bool(np.all(seq[1:] > seq[:-1])):
        return np.arange(n)
    tails_val: list = []
    tails_idx: list = []
    back = np.full(n, -1, dtype=np.int64)
    for i, v in enumerate(seq.tolist()):
        j = bisect_left(tails_val, v)
        if j > 0:
            back[i] = tails_idx[j - 1]
        if j == len(tails_val):
            tails_val.append(v)
            tails_idx.append(i)
        else:
            tails_val[j] = v
            tails_idx[j] = i
    out = []
    i = tails_idx[-1]
    while i >= 0:
        out.append(i)
        i = back[i]
    return np.asarray(out[::-1], dtype=np.int64)


def align(a: Placements, b: Placements) -> tuple[np.ndarray, np.ndarray]:
    """Matched placement numbers (pa, pb), increasing on both sides."""
    ids: dict = {}
    ka, kb = identity_keys(a.names, ids), identity_keys(b.names, ids)
    _, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)
    order = np.argsort(ia, kind="stable")
    ia, ib = ia[order], ib[order]
    keep = longest_increasing(ib)
    return ia[keep].astype(np.int64), ib[keep].astype(np.int64)
