"""The compiled replay of a recorded reserve (plans_fast.c): the call's tensor lines in, the model's plan and
its events in the store's columns out, byte for byte what the Python path (build_graph, Gallocr.reserve,
encode_arrays, shapes) gives. A sweep of a small model's dry runs spends most of its Python time there.

`reserve(...)` returns a `FastReserve`, or None where the C side declines (a line it does not read exactly as
the Python reader would, a value out of range, a tensor it cannot find): the caller then replays the call on
the Python path, which also says what is wrong with it. tests/record/test_replay_fast.py compares the two paths on
every committed recording and on generated graphs.

The library is built with the system C compiler at install time and loaded only from the package
(traces/util/cbuild.py); without it, or with ALLOCTRACE_PURE_PYTHON=1, the Python path runs alone.
"""
from __future__ import annotations

import ctypes
import os
from array import array
from alloctrace.allocator.record_class import record_class
from pathlib import Path

from alloctrace.allocator.dyn_tallocr import Chunk, SIZE_MAX
from alloctrace.allocator.events import Event
from alloctrace.allocator.gallocr import INVALID, NO_ALLOC
from alloctrace.traces.store.columns import INT_FIELDS, INT_TYPES, STR_FIELDS, EventColumns
from alloctrace.traces.util.cbuild import InstalledLibrary

SOURCE = Path(__file__).with_name("plans_fast.c")
COLUMNS = INT_FIELDS + STR_FIELDS + ("srcs", "extra")  # plans_fast.c's column order (encode_arrays')
SYMBOLS = ("rf_sizeof", "rf_new", "rf_free", "rf_reason", "rf_reserve")
_TYPES = {size: (dt, code) for size, (dt, code, _, _) in zip((1, 2, 4, 8), INT_TYPES)}
_CODES = {dt: (code, lo) for dt, code, lo, _ in INT_TYPES}
_P = ctypes.POINTER
I64 = ctypes.c_int64


class RfIn(ctypes.Structure):
    _fields_ = [("text", ctypes.c_char_p), ("text_len", I64), ("n_nodes", I64), ("n_leafs", I64),
                ("node_ids", _P(I64)), ("n_node_ids", I64), ("leaf_ids", _P(I64)), ("n_leaf_ids", I64),
                ("n_bufs", I64), ("alignment", _P(I64)), ("max_chunk", _P(I64)), ("owner", _P(I64)),
                ("buft_names", ctypes.c_char_p), ("buft_name_len", _P(I64)), ("cur_n", _P(I64)),
                ("cur_sizes", _P(I64)), ("no_alloc", I64), ("max_free_blocks", I64), ("graph", I64),
                ("want_shapes", I64), ("max_shapes", I64), ("inplace", ctypes.c_char_p), ("inplace_len", I64)]


class RfOut(ctypes.Structure):
    _fields_ = [("ok", I64), ("n_events", I64), ("failed", I64), ("fail_event", I64),
                ("cols", ctypes.c_void_p * len(COLUMNS)), ("col_len", I64 * len(COLUMNS)),
                ("itemsize", I64 * len(COLUMNS)), ("table", ctypes.c_void_p), ("table_len", I64),
                ("shapes", ctypes.c_void_p), ("shapes_len", I64), ("state", _P(I64)), ("state_len", I64)]


def _bind(lib):
    """(the library, its state handle), its functions given their C types."""
    lib.rf_new.restype = ctypes.c_void_p
    lib.rf_free.argtypes = [ctypes.c_void_p]
    lib.rf_reason.restype = ctypes.c_char_p
    lib.rf_reason.argtypes = [ctypes.c_void_p]
    lib.rf_reserve.argtypes = [ctypes.c_void_p, _P(RfIn), _P(RfOut)]
    lib.rf_reserve.restype = ctypes.c_int
    return lib, lib.rf_new()


_FAST = InstalledLibrary(SOURCE, "plans_fast", SYMBOLS, ("rf_sizeof", {"RfIn": RfIn, "RfOut": RfOut}), _bind,
                         "recordings")
library = _FAST.get               # (the library, its state handle), or None (not built at install time, a failed
unavailable = _FAST.unavailable   # check, ALLOCTRACE_PURE_PYTHON=1); unavailable() says why
path_line = _FAST.path_line       # which path reads recordings, in words (`import --verbose`)


@record_class
class FastReserve:
    """What one compiled reserve gave: its result, the failure event (oom or abort) if any, the columns
    ([(name, dtype, bytes)], as `pack_arrays` takes them before compressing) and the table's JSON text."""

    ok: bool
    n_events: int
    failed: Event | None
    columns: list
    table_json: bytes
    shapes_json: bytes | None


def _ints(values, keep: list):
    """A pointer to `values` as int64s, kept alive in `keep` for the call (no ctypes array type per length: each
    would be a new type object, garbage in a cycle)."""
    a = array("q", values or (0,))
    keep.append(a)
    return ctypes.cast(a.buffer_info()[0], _P(I64))


def reserve(galloc, lines: list[str], n_nodes: int, n_leafs: int, node_ids, leaf_ids, graph_index: int,
            no_alloc: bool, want_shapes: bool, max_shapes: int) -> FastReserve | None:
    """Gallocr.reserve(graph, graph_index, node_ids, leaf_ids, no_alloc) of the graph these tensor lines
    describe, on `galloc`'s state, which it leaves as the Python reserve would; None: declined (galloc
    untouched)."""
    got = library()
    if got is None:
        return None
    lib, handle = got
    bts = galloc.buffer_types
    names = [bt.name.encode() for bt in bts]
    if not all(bt.name.isascii() for bt in bts) or len(bts) > 64:
        return None
    text = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape") if lines else b""
    inplace = "".join(op + "\n" for op in sorted(galloc.profile.inplace_ops)).encode()
    cur = galloc.buffer_chunk_sizes
    node_ids = node_ids or ()
    leaf_ids = leaf_ids or ()
    keep: list = []
    args = RfIn(text, len(text), n_nodes, n_leafs, _ints(node_ids, keep), len(node_ids), _ints(leaf_ids, keep),
                len(leaf_ids), len(bts), _ints([d.alignment for d in (galloc.dyns[o] for o in galloc.owner)], keep),
                _ints([min(galloc.dyns[o].max_chunk_size, SIZE_MAX // 2) for o in galloc.owner], keep),
                _ints(galloc.owner, keep), b"".join(names), _ints([len(n) for n in names], keep),
                _ints([-1 if c is None else len(c) for c in cur], keep), _ints([s for c in cur if c for s in c], keep),
                int(no_alloc), galloc.profile.max_free_blocks, graph_index, int(want_shapes), max_shapes,
                inplace, len(inplace))
    out = RfOut()
    if lib.rf_reserve(handle, ctypes.byref(args), ctypes.byref(out)) != 0:
        return None
    columns = []
    for k, name in enumerate(COLUMNS):
        if out.cols[k]:
            dt, _ = _TYPES[out.itemsize[k]]
            columns.append((name, dt, ctypes.string_at(out.cols[k], out.col_len[k])))
    table = ctypes.string_at(out.table, out.table_len)
    shapes = ctypes.string_at(out.shapes, out.shapes_len) if want_shapes else None
    state = array("q", ctypes.string_at(out.state, out.state_len * 8)).tolist() if out.state_len else []
    failed = _failure(out, columns, table) if out.failed else None
    _apply(galloc, state, out.ok, no_alloc, n_nodes, n_leafs)
    return FastReserve(bool(out.ok), out.n_events, failed, columns, table, shapes)


def _failure(out: RfOut, columns: list, table: bytes) -> Event:
    """The oom or abort event the walk stopped at (what Gallocr.failed holds)."""
    return event_columns(out.n_events, columns, table)[out.fail_event]


def event_columns(n: int, columns: list, table_json: bytes) -> EventColumns:
    """The compiled replay's columns as EventColumns (for a caller that sums the graph up right away)."""
    import json

    return EventColumns(n, {name: (dt, data) for name, dt, data in columns}, json.loads(table_json))


class _Plan:
    """Gallocr.node_allocs / leaf_allocs as the compiled reserve left them, made into the model's tuples only
    if an alloc_graph asks for them (a dry run never does)."""

    def __init__(self, make):
        self._make, self._items = make, None

    def _all(self) -> list:
        if self._items is None:
            self._items = self._make()
        return self._items

    def __len__(self):
        return len(self._all())

    def __iter__(self):
        return iter(self._all())

    def __getitem__(self, i):
        return self._all()[i]


def _apply(g, state: list, ok: bool, no_alloc: bool, n_nodes: int, n_leafs: int) -> None:
    """Set the Python model's state from the C side's: each allocator's chunks, then (a reserve that
    finished) the buffers it grew and the plan alloc_graph reuses."""
    pos = 0
    for i, dyn in enumerate(g.dyns):
        if dyn is None:
            continue
        n = state[pos]
        pos += 1
        chunks = []
        for _ in range(n):
            max_size, nf = state[pos], state[pos + 1]
            pos += 2
            chunks.append(Chunk(state[pos:pos + nf], state[pos + nf:pos + 2 * nf], max_size))
            pos += 2 * nf
        dyn.chunks = chunks
    if not ok:
        return
    for i in range(len(g.buffer_types)):
        what = state[pos]
        pos += 1
        if what == 1:
            n = state[pos]
            g.buffer_chunk_sizes[i] = state[pos + 1:pos + 1 + n]
            pos += 1 + n
        elif what == 2:
            g.buffer_chunk_sizes[i] = None

    def talloc(at):
        b, c, o, s = state[at:at + 4]
        return NO_ALLOC if b < 0 else (b, (c, o), s)

    def node_allocs():
        at, out = pos, []
        for _ in range(n_nodes):
            dst, ns = talloc(at), state[at + 4]
            at += 5
            out.append((dst, [talloc(at + 4 * j) for j in range(ns)]))
            at += 4 * ns
        return out

    def leaf_allocs():
        at = pos
        for _ in range(n_nodes):  # past every node's (dst, n srcs, srcs)
            at += 5 + 4 * state[at + 4]
        return [talloc(at + 4 * j) for j in range(n_leafs)]

    g.node_allocs, g.leaf_allocs = _Plan(node_allocs), _Plan(leaf_allocs)
    g.n_nodes, g.n_leafs = n_nodes, n_leafs


assert NO_ALLOC == (-1, INVALID, 0)
