"""A state request that is a graph's first reads only what it needs, and answers what the full path answers.

The references are the paths a state request took before: `Store.columns` (every column decoded),
the lifetimes of `memmap.extract` for the op of each live tensor (`traces/memmap/live_ops.py: name_live_ops_from_lifetimes`),
and the HTTP answer of a server that drew the memory map first. Checked on every graph of the real
logs, on multi-chunk head graphs, on random graphs (double frees, reuses by name only, free_extra,
realloc) and on a long synthetic graph stored with its checkpoints.
"""
from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings, strategies as st

from alloctrace.allocator.record_class import replace
from alloctrace.traces.memmap.live_ops import name_live_ops_from_lifetimes
from alloctrace.server.app import create_app
from alloctrace.traces.memmap import live_ops
from alloctrace.traces import memmap
from alloctrace.traces.store import store as store_mod
from alloctrace.traces.store.columns import FIELDS, event_rows
from alloctrace.traces.store.columns_lazy import LazyColumns, StringTable
from alloctrace.traces.store.graph_info import graph_info
from alloctrace.traces.memmap.live_ops import name_live_ops
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.sources import import_paths
from alloctrace.traces.state.index import StateIndex
from alloctrace.traces.store.store import open_store
from test_memmap import columns_of, synthetic_events
from test_state_checkpoints import REAL_LOGS, events_of, head_run, op


@settings(max_examples=200, deadline=None)
@given(strings=st.lists(st.text(alphabet=st.sampled_from('ab"\\\n\té€\U0001f600 ,[]'), max_size=8), max_size=30),
       ascii_only=st.booleans())
def test_string_table_reads_what_json_reads(strings, ascii_only):
    data = json.dumps(strings, ensure_ascii=ascii_only).encode()
    table = StringTable(data)
    assert len(table) == len(strings) and [table[k] for k in range(len(table))] == json.loads(data)


def assert_same_columns(lazy: LazyColumns, cols: dict, seed: int = 0):
    """Every column, sliced, picked at random rows and at single rows, as public_columns has it."""
    n = len(cols["i"])
    assert list(lazy) == list(cols) == ["i"] + FIELDS
    rng = np.random.default_rng(seed)
    picks = [slice(None), slice(n // 3, n // 3 * 2 + 1), slice(n, n), rng.integers(0, max(n, 1), 17) if n else []]
    for name in cols:
        for rows in picks:
            got, want = lazy[name][rows], cols[name][rows]
            assert got.dtype == want.dtype and got.tolist() == want.tolist(), (name, rows)
        for i in rng.integers(0, n, 5).tolist() if n else []:
            got, want = lazy[name][i], cols[name][i]
            assert type(got) is type(want) and got == want, (name, i)
    for k in ("alloc", "oom", "no such kind"):
        assert ((lazy["kind"] == k) == (cols["kind"] == k)).all()


@pytest.fixture(autouse=True)
def first_window():
    old = live_ops.FIRST_WINDOW
    yield
    live_ops.FIRST_WINDOW = old


def assert_same_ops(events, cols, capacity=None, lazy=None) -> int:
    """At every event: the ops name_live_ops gives the live tensors are the lifetimes' ones. Returns how
    many live tensors got an op (so a test can see it compared something)."""
    lt = memmap.extract(cols)
    index = StateIndex(cols, capacity)
    named = 0
    for n in range(len(events) + 1):
        live = index.state(n)["live"]
        want = copy.deepcopy(live)
        name_live_ops_from_lifetimes(want, lt, n)
        by_name = any(e.kind == "reuse" and e.offset is None for e in events[:n])
        for source, window in [(cols, 1), (cols, 3), (cols, 1 << 13)] + ([(lazy, 2)] if lazy is not None else []):
            got = copy.deepcopy(live)
            live_ops.FIRST_WINDOW = window  # from the last events back: small windows widen many times
            if name_live_ops(got, source, n):
                assert got == want, n
                named += sum("op" in t for t in want) if window == 1 else 0
            else:  # only a reuse by name among the events it looked at sends it to the lifetimes
                assert by_name and got == live, n
    return named


@pytest.mark.parametrize("log", REAL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_logs(log, tmp_path):
    """Every graph of every real log: lazy columns, graph facts, event rows and live ops."""
    store = open_store(tmp_path)
    (tid,) = import_paths(store, [log])
    named = 0
    for row in store.summary(tid)["graphs"]:
        g = row["index"]
        cols, lazy = store.columns(tid, g), store.lazy_columns(tid, g)
        assert_same_columns(lazy, cols, seed=g)
        assert graph_info(row, lazy) == graph_info(row, cols)
        every = list(range(len(cols["i"])))
        assert event_rows(lazy, every) == event_rows(cols, every)
        events = store.events(tid, g)
        named += assert_same_ops(events, cols, graph_info(row, cols)["capacity"], lazy)
    store.close()
    assert named or "explain" in str(log)  # the real graphs name ops of their live tensors


@pytest.mark.parametrize("buffers", [1, 2])
def test_multi_chunk_head_graphs(buffers):
    events = head_run(max_size=4096, buffers=buffers)
    events = [replace(e, op=f"OP{i % 5}") for i, e in enumerate(events)]
    assert assert_same_ops(events, columns_of(events)) > 0


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op, max_size=120), chunked=st.booleans(), capacity=st.sampled_from([None, 256, 512]),
       named=st.booleans())
def test_random_graphs(ops, chunked, capacity, named):
    events = events_of(ops, chunked)
    if not named:  # reuses by name only make extract replay names: the lifetimes are asked instead
        events = [e for e in events if not (e.kind == "reuse" and e.offset is None)]
    events = [replace(e, op=random.Random(i).choice([None, "", "ADD", "MUL"])) for i, e in enumerate(events)]
    assert_same_ops(events, columns_of(events), capacity)


def test_a_tail_given_back_whole_leaves_no_lifetime():
    """A head reuse whose free_extra gives back every byte: the node stays live in the replay but its
    lifetime has no bytes, so it gets no op; the tensor allocated over it later gets its own."""
    from alloctrace.allocator import Event
    events = [Event("alloc", tensor="a", op="ADD", offset=0, size=64),
              Event("reuse", tensor="b", op="MUL", offset=0, parent="a"),
              Event("free_extra", tensor="b", offset=0, size=64),
              Event("alloc", tensor="c", op="SUB", offset=64, size=32)]
    assert_same_ops(events, columns_of(events))
    live = StateIndex(columns_of(events), None).state(4)["live"]
    name_live_ops(live, columns_of(events), 4)
    assert [(t["tensor"], t.get("op")) for t in live] == [("b", None), ("c", "SUB")]


def test_a_free_extra_whose_reuse_is_before_the_window():
    """The events looked at first hold a sizing alloc on the live bytes but not the reuse the
    free_extra after it belongs to: they must not be taken as enough."""
    from alloctrace.allocator import Event
    events = [Event("alloc", tensor="a", op="ADD", offset=0, size=64),
              Event("reuse", tensor="b", op="MUL", offset=0, parent="a"),
              Event("view", tensor="v"),
              Event("alloc", tensor="c", op="SUB", offset=0, size=64),  # over live bytes: the replay keeps b
              Event("free_extra", tensor="b", offset=32, size=32)]
    assert_same_ops(events, columns_of(events))
    live = StateIndex(columns_of(events), None).state(5)["live"]
    live_ops.FIRST_WINDOW = 3
    name_live_ops(live, columns_of(events), 5)
    assert [(t["tensor"], t.get("op")) for t in live] == [("b", "MUL")]


def test_synthetic_graph_lazy_columns(tmp_path):
    events = synthetic_events(1200, seed=3)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("synthetic", "synthetic", "ggml-head"), [GraphRecord(0, "reserve", events)])
    cols, lazy = store.columns(tid, 0), store.lazy_columns(tid, 0)
    assert_same_columns(lazy, cols)
    assert assert_same_ops(events, cols, lazy=lazy) > 0
    store.close()


def test_cold_state_requests_answer_as_after_the_map(tmp_path, monkeypatch):
    """A long graph stored with checkpoints: a server whose first request is a state request answers
    byte for byte what a server that drew the memory map first answers, at every event asked."""
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", 0)
    monkeypatch.setattr(StateIndex, "step", 500)
    events = synthetic_events(6000, seed=5)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("long", "synthetic", "ggml-head"),
                          [GraphRecord(0, "reserve", events, max_size=4096 << 20)])
    store.close()
    at = [5999, 6000, 0, 1, 3001, 4500, 4501, 123]
    base = f"/api/traces/{tid}/graphs/0/"
    with TestClient(create_app(tmp_path, token=None)) as warm:
        assert warm.get(base + "memory-map").status_code == 200
        want = [warm.get(base + "state", params={"event": n}).content for n in at]
    with TestClient(create_app(tmp_path, token=None)) as cold:
        got = [cold.get(base + "state", params={"event": n}).content for n in at]
        ctx = cold.app.state.ctx
        assert ctx.columns_cache.peek((tid, 0)) is None and ctx.lifetimes_cache.peek((tid, 0)) is None
        assert ctx.lazy_cache.peek((tid, 0)) is not None  # answered from the compressed columns
        assert cold.get(base + "state", params={"event": 6001}).status_code == 400
    assert got == want
    assert b'"op":"ADD"' in got[0]  # live tensors named by their ops


def test_a_graph_without_stored_checkpoints_is_decoded(tmp_path):
    """A short graph replays from its start: its state request decodes the columns, never twice."""
    events = synthetic_events(400, seed=2)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("short", "synthetic", "ggml-head"), [GraphRecord(0, "reserve", events)])
    assert store.saved_states(tid, 0) is None
    store.close()
    base = f"/api/traces/{tid}/graphs/0/"
    with TestClient(create_app(tmp_path, token=None)) as cold:
        got = [cold.get(base + "state", params={"event": n}).content for n in (400, 17)]
        ctx = cold.app.state.ctx
        assert ctx.lazy_cache.peek((tid, 0)) is None and ctx.columns_cache.peek((tid, 0)) is not None
        assert ctx.lifetimes_cache.peek((tid, 0)) is None  # the live ops without the lifetimes
    with TestClient(create_app(tmp_path, token=None)) as warm:
        assert warm.get(base + "memory-map").status_code == 200
        assert [warm.get(base + "state", params={"event": n}).content for n in (400, 17)] == got
