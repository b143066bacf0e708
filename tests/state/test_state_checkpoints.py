"""Stored state checkpoints give exactly what a replay from the start gives.

The reference is `states_at` (every event applied one by one through `Replay.apply`); the
index answers from checkpoints made on demand (the path of graphs stored without them) and
from checkpoints kept in the store (JSON, as `Store.saved_states` loads them). Checked on the
real logs of every generation, on multi-chunk and multi-buffer head graphs of the allocator
model, on random graphs with broken frees and named reuses, and on a store written before
checkpoints were kept.
"""
from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from alloctrace.allocator import Event, get_profile
from alloctrace.allocator.gallocr import BufferType, Gallocr
from alloctrace.allocator.harness import graph_from_json
from alloctrace.traces.state import index as state_index_mod
from alloctrace.traces.store import store as store_mod
from alloctrace.traces.store.graph_info import graph_info
from alloctrace.traces.sources import import_paths
from alloctrace.traces.state.free_list import states_at
from alloctrace.traces.state.index import Saved, StateIndex, saved_checkpoints
from alloctrace.traces.store.store import open_store
from conftest import load_harness
from test_memmap import columns_of, synthetic_events

DATA = Path(__file__).resolve().parents[1] / "data"
REAL_LOGS = sorted((DATA / "ggml-real").glob("*/*.log")) + sorted((DATA / "explain").glob("*.log.gz"))


def saved_of(cols, capacity) -> Saved:
    """Checkpoints as the store keeps them: through JSON, loaded one at a time."""
    kept = {cp["n"]: json.dumps(cp) for cp in saved_checkpoints(cols, capacity)}
    return Saved(sorted(kept), lambda n: json.loads(kept[n]))


def assert_same_states(events, cols, capacity, saved=None, seed=0):
    """Every event's state, asked in random order, from stored and from on-demand checkpoints."""
    points = list(range(len(events) + 1))
    want = states_at(events, points, capacity=capacity)
    stored = StateIndex(cols, capacity, saved or saved_of(cols, capacity))
    assert stored._saved is not None  # the stored checkpoints were taken, not rebuilt
    lazy = StateIndex(cols, capacity)
    random.Random(seed).shuffle(points)
    for n in points:
        assert stored.state(n) == want[n], n
        assert lazy.state(n) == want[n], n
    # both kinds stand at the same events: the store keeps what a replay to the end makes
    assert sorted(lazy.checkpoints) == stored._marks


@pytest.fixture
def small_step(monkeypatch):
    monkeypatch.setattr(StateIndex, "step", 8)  # real graphs are a few hundred events: many checkpoints


@pytest.mark.parametrize("log", REAL_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_logs_stored_with_checkpoints(log, tmp_path, monkeypatch, small_step):
    """Every graph of every real log, stored with its checkpoints (the store's own path), at every event."""
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", 0)
    store = open_store(tmp_path)
    (tid,) = import_paths(store, [log])
    for row in store.summary(tid)["graphs"]:
        g = row["index"]
        cols = store.columns(tid, g)
        capacity = graph_info(row, cols)["capacity"]
        saved = store.saved_states(tid, g)
        assert saved is not None and saved.marks[0] == 0
        assert_same_states(store.events(tid, g), cols, capacity, saved, seed=g)
    store.close()


def test_pytorch_snapshots_keep_no_ggml_checkpoints(tmp_path, monkeypatch):
    """A snapshot's devices are stored as graphs too, of allocator entries, not ggml events."""
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", 0)
    store = open_store(tmp_path)
    (tid,) = import_paths(store, [DATA / "torch" / "oom.pickle.gz"])
    assert store.summary(tid)["graphs"]
    assert store.db.execute("SELECT count(*) FROM state_checkpoints").fetchone()[0] == 0
    assert not store.add_state_checkpoints(tid, 0, [(0, b"")])
    store.close()


def head_run(max_size: int, buffers: int) -> list[Event]:
    """The harness graphs through the head allocator model with small chunks (and several buffers)."""
    desc = load_harness(DATA / "ggml-real" / "head-gallocr" / "harness_gallocr.json")
    types = [BufferType(f"B{b}", desc["alignment"], max_size=max_size, key=b) for b in range(buffers)]
    galloc = Gallocr(get_profile("ggml-head"), buffer_types=types)
    for gd in desc["graphs"]:
        g = graph_from_json(gd, legacy=False)
        if buffers == 1:
            galloc.alloc_graph(g, graph_index=gd["step"])
        else:
            galloc.reserve(g, graph_index=gd["step"], node_buffer_ids=[i % buffers for i in range(g.n_nodes)],
                           leaf_buffer_ids=[i % buffers for i in range(g.n_leafs)])
    return galloc.events


@pytest.mark.parametrize("buffers", [1, 2])
def test_multi_chunk_head_graphs(buffers, small_step):
    events = head_run(max_size=4096, buffers=buffers)
    assert max(e.chunk or 0 for e in events) >= 2  # several chunks
    if buffers > 1:
        assert {e.buffer for e in events if e.kind == "alloc"} == set(range(buffers))
    else:
        assert any(e.kind == "realloc" for e in events)  # a graph that did not fit the plan: replanned
    assert_same_states(events, columns_of(events), None)


NAMES = [f"t{i}" for i in range(6)]
op = st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from(NAMES), st.integers(0, 2), st.integers(0, 31), st.integers(1, 8)),
    st.tuples(st.just("free"), st.sampled_from(NAMES), st.integers(0, 2), st.integers(0, 31), st.integers(0, 8)),
    st.tuples(st.just("reuse"), st.sampled_from(NAMES), st.integers(0, 2), st.integers(-1, 31), st.just(0)),
    st.tuples(st.just("free_extra"), st.sampled_from(NAMES), st.integers(0, 2), st.integers(0, 31),
              st.integers(1, 4)),
    st.tuples(st.just("reuse_tail"), st.sampled_from(NAMES), st.integers(0, 2), st.integers(0, 31),
              st.integers(1, 4)),
    st.tuples(st.sampled_from(["realloc", "view", "exec"]), st.sampled_from(NAMES), st.just(0), st.just(0),
              st.just(0)))


def events_of(ops, chunked: bool) -> list[Event]:
    """Raw operations as events: offsets and sizes in 16-byte units, a reuse of offset -1 names its
    parent only (head logs), anything may be inconsistent (double frees, allocs over live bytes)."""
    out = []
    for kind, name, chunk, off, size in ops:
        chunk = chunk if chunked else None
        if kind == "reuse":
            out.append(Event("reuse", tensor=name + "r", chunk=chunk, offset=None if off < 0 else off * 16,
                             parent=name))
        elif kind == "reuse_tail":  # head: a node takes its parent's bytes and gives the tail back
            out.append(Event("alloc", tensor=name, chunk=chunk, offset=off * 16, size=(size + 2) * 16))
            out.append(Event("reuse", tensor=name + "r", chunk=chunk, offset=off * 16, parent=name))
            out.append(Event("free_extra", tensor=name + "r", chunk=chunk, offset=(off + size) * 16, size=32))
        elif kind in ("realloc", "view", "exec"):
            out.append(Event(kind, tensor=name))
        else:
            out.append(Event(kind, tensor=name, chunk=chunk, offset=off * 16, size=size * 16 + (kind == "free")))
    return out


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op, max_size=120), chunked=st.booleans(), capacity=st.sampled_from([None, 256, 512]),
       step=st.integers(1, 20))
def test_random_graphs(ops, chunked, capacity, step):
    events = events_of(ops, chunked)
    old = StateIndex.step
    StateIndex.step = step
    try:
        assert_same_states(events, columns_of(events), capacity)
    finally:
        StateIndex.step = old


def test_a_long_graph_keeps_its_checkpoints_in_the_store(tmp_path, monkeypatch):
    """Stored at add_trace, bounded like the on-demand ones, gone with the trace."""
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", 20_000)
    monkeypatch.setattr(StateIndex, "step", 1000)
    events = synthetic_events(30_000, seed=4, slots=512)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("long", "synthetic", "ggml-head"),
                          [GraphRecord(0, "reserve", events), GraphRecord(1, "reserve", events[:19_999])])
    assert store.saved_states(tid, 1) is None  # short graphs make theirs on demand
    saved = store.saved_states(tid, 0)
    cols = store.columns(tid, 0)
    rng = random.Random(5)
    points = [rng.randrange(len(events) + 1) for _ in range(30)] + [0, len(events)]
    want = states_at(events, points)
    index = StateIndex(cols, None, saved)
    assert index._saved is not None
    for n in points:
        assert index.state(n) == want[n], n
    # the same events as a replay to the end makes them, and as few entries
    lazy = StateIndex(cols, None)
    lazy.state(len(events))
    assert saved.marks == sorted(lazy.checkpoints)
    assert entries_of(saved) <= 2 * len(events)
    # another capacity than the one they were made for: made on demand instead
    other = StateIndex(cols, 1 << 40, saved)
    assert other._saved is None and other.state(len(events)) == states_at(events, [len(events)],
                                                                          capacity=1 << 40)[len(events)]
    store.delete(tid)
    assert store.db.execute("SELECT count(*) FROM state_checkpoints").fetchone()[0] == 0
    assert not store.add_state_checkpoints(tid, 0, [(0, b"")])
    store.close()


def entries_of(saved: Saved) -> int:
    """Entries all the checkpoints hold together: live tensors, free blocks, names, anomalies."""
    return sum(len(cp["live"]) + sum(len(f[1]) for f in cp["free"]) + len(cp["where"]) + len(cp["anomalies"])
               for cp in map(saved.load, saved.marks))


def test_a_graph_of_broken_frees_keeps_its_checkpoints_bounded(monkeypatch):
    """Each double free adds an anomaly every later state carries: they count towards the spacing,
    or a checkpoint every `step` events would copy a growing list (quadratic)."""
    monkeypatch.setattr(StateIndex, "step", 50)
    events = [Event("alloc", tensor="a", offset=0, size=64)] + [Event("free", tensor="a", offset=0, size=64)] * 4000
    cols = columns_of(events)
    saved = saved_of(cols, None)
    # each checkpoint holds no more entries than the events since the one before, the last one at most its own
    assert len(saved.marks) > 5 and entries_of(saved) <= 2 * len(events)
    index = StateIndex(cols, None, saved)
    want = states_at(events, [0, 1, 2, 777, 3999, 4001])
    for n, st_n in want.items():
        assert index.state(n) == st_n


def test_stored_checkpoints_end_where_the_state_grows_too_big(monkeypatch):
    """A graph whose live set keeps growing (allocations never freed) stores checkpoints only while a
    state holds at most SAVED_MAX_ENTRIES entries; states past the last one replay from it, unchanged."""
    monkeypatch.setattr(StateIndex, "step", 50)
    monkeypatch.setattr(state_index_mod, "SAVED_MAX_ENTRIES", 200)
    events = [Event("alloc", tensor=f"t{i}", offset=64 * i, size=64) for i in range(2000)]
    cols = columns_of(events)
    saved = saved_of(cols, None)
    lazy = StateIndex(cols, None)
    lazy.state(len(events))
    assert saved.marks == sorted(lazy.checkpoints)[:len(saved.marks)] and saved.marks[-1] < 1000
    assert max(len(saved.load(m)["live"]) for m in saved.marks) <= 2 * 200
    index = StateIndex(cols, None, saved)
    want = states_at(events, [0, 199, 400, 1500, 2000])
    for n, st_n in want.items():
        assert index.state(n) == st_n


def test_a_store_written_before_checkpoints_still_answers(tmp_path, monkeypatch):
    """An older store has no checkpoint table: opening it adds the table, states are made on demand,
    and the server stores the long graph's checkpoints meanwhile, for the next server."""
    from alloctrace.server.context import Context
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", 1000)
    monkeypatch.setattr(state_index_mod, "SAVED_MIN_EVENTS", 1000)
    monkeypatch.setattr(StateIndex, "step", 100)
    events = synthetic_events(3000, seed=6, slots=64)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("old", "synthetic", "ggml-head"), [GraphRecord(0, "reserve", events)])
    store.close()
    db = sqlite3.connect(tmp_path / store_mod.DB_NAME)
    db.execute("DROP TABLE state_checkpoints")  # the schema before this table existed
    db.commit()
    db.close()
    store = open_store(tmp_path)
    assert store.saved_states(tid, 0) is None
    want = states_at(events, [0, 1234, len(events)])
    ctx = Context(store, 1 << 20)
    try:
        index = ctx.state_index(tid, 0)
        assert index._saved is None
        for n, st_n in want.items():
            assert index.state(n) == st_n
        ctx.keeping.join(60)
    finally:
        ctx.close()
    store = open_store(tmp_path)
    saved = store.saved_states(tid, 0)
    lazy = StateIndex(store.columns(tid, 0), None)
    lazy.state(len(events))
    assert saved is not None and saved.marks == sorted(lazy.checkpoints)
    assert not store.add_state_checkpoints(tid, 0, [(0, b"")])  # kept once
    ctx = Context(store, 1 << 20)
    try:
        index = ctx.state_index(tid, 0)
        assert index._saved is not None and ctx.keeping is None
        for n, st_n in want.items():
            assert index.state(n) == st_n
    finally:
        ctx.close()
