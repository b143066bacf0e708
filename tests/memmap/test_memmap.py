"""Tensor lifetimes for the memory map agree with the allocator state rebuilt event by event,
and a view window's reduction never exceeds its shape budget."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alloctrace.allocator import Gallocr, get_profile
from alloctrace.allocator.events import Event
from alloctrace.allocator.harness import graph_from_json
from conftest import load_harness
from alloctrace.traces import memmap
from alloctrace.traces.memmap import view as memmap_view
from alloctrace.traces.util.lru import LRU
from alloctrace.traces.store.columns import encode, public_columns
from alloctrace.traces.sources import import_paths
from alloctrace.traces.state.free_list import state_at, states_at
from alloctrace.traces.store.store import open_store


def columns_of(events):
    cols, table = encode(events)
    return public_columns(len(events), cols, table)


def synthetic_events(n: int, seed: int = 0, slots: int = 4096, slot_bytes: int = 1 << 20) -> list[Event]:
    """An allocator-like stream: allocs into free slots, frees, inplace reuses, views and exec noise."""
    rng = random.Random(seed)
    free, live, out = list(range(slots)), [], []
    while len(out) < n:
        r = rng.random()
        if free and (r < 0.35 or not live):
            s = free.pop(rng.randrange(len(free)) if out else 0)  # the first block starts the buffer
            size = rng.randrange(1, slot_bytes // 16 + 1) * 16
            live.append((s, size))
            out.append(Event("alloc", tensor=f"t{len(out)}", op="ADD", size=size, offset=s * slot_bytes, block=0,
                             n_free=len(free), largest_free=slot_bytes, total_free=len(free) * slot_bytes))
        elif r < 0.7 and live:
            s, size = live.pop(rng.randrange(len(live)))
            free.append(s)
            out.append(Event("free", tensor="x", size=size, offset=s * slot_bytes, n_free=len(free),
                             largest_free=slot_bytes, total_free=len(free) * slot_bytes))
        elif r < 0.8 and live:
            j = rng.randrange(len(live))
            s, size = live[j]
            out.append(Event("reuse", tensor=f"r{len(out)}", op="MUL", parent="p", offset=s * slot_bytes))
            if size >= 32 and rng.random() < 0.3:  # head: the node is smaller, the tail goes back
                keep = size // 32 * 16
                live[j] = (s, keep)
                out.append(Event("free_extra", tensor=f"r{len(out) - 1}", size=size - keep,
                                 offset=s * slot_bytes + keep))
        elif r < 0.9:
            out.append(Event("view", tensor="v", offset=0))
        else:
            out.append(Event("exec", tensor="e", op="ADD", offset=0, size=16))
    return out


def live_sets(lt: memmap.Lifetimes, k: int):
    """Tensors whose lifetime covers event k (placed at or before it, released after it)."""
    m = (lt.start <= k) & (lt.end > k)
    return sorted(zip(lt.chunk[m].tolist(), lt.offset[m].tolist(), lt.size[m].tolist(), lt.tensor[m].tolist()))


def assert_matches_state(events, lt: memmap.Lifetimes):
    states = states_at(events, range(1, len(events) + 1))
    for k in range(len(events)):
        st_k = states[k + 1]
        want = sorted((t["chunk"], t["offset"], t["size"], t["tensor"]) for t in st_k["live"])
        assert live_sets(lt, k) == want, f"event {k} ({events[k].kind})"
        assert lt.used[k] == st_k["live_bytes"]


@pytest.fixture(scope="module")
def imported(fixtures, tmp_path_factory):
    store = open_store(tmp_path_factory.mktemp("memmap-store"))
    ids = import_paths(store, sorted(fixtures.rglob("*.log")))
    return store, ids


def test_lifetimes_match_the_replayed_state_on_every_real_log(imported):
    store, ids = imported
    checked = 0
    for tid in ids:
        for g in store.summary(tid)["graphs"]:
            events = store.events(tid, g["index"])
            lt = memmap.extract(store.columns(tid, g["index"]))
            assert lt.n_events == len(events)
            assert_matches_state(events, lt)
            if g["max_size"] and g["role"] == "measure":
                assert lt.y_extent <= g["max_size"]
            checked += 1
    assert checked >= 20


def test_head_lifetimes_follow_reuse_and_realloc(fixtures):
    desc = load_harness(fixtures / "head-gallocr" / "harness_gallocr.json")
    galloc = Gallocr(get_profile("ggml-head"), desc["alignment"])
    for gd in desc["graphs"]:
        galloc.alloc_graph(graph_from_json(gd, legacy=False), graph_index=gd["step"])
    kinds = {e.kind for e in galloc.events}
    assert {"reuse", "realloc"} <= kinds
    for g in sorted({e.graph for e in galloc.events}):
        events = [e for e in galloc.events if e.graph == g]
        assert_matches_state(events, memmap.extract(columns_of(events)))


def test_synthetic_stream_matches_state():
    events = synthetic_events(3000, seed=7)
    assert {"alloc", "free", "reuse", "free_extra", "view"} <= {e.kind for e in events}
    lt = memmap.extract(columns_of(events))
    assert_matches_state(events, lt)
    assert not np.any(np.isin(lt.tensor, ["v", "e"]))  # views and exec lines are no lifetimes


def test_series_follows_the_free_list_fields():
    events = synthetic_events(500, seed=3)
    lt = memmap.extract(columns_of(events))
    rows, bucket = memmap.window_series(lt, 0, 500, 1000)
    assert bucket == 1 and [r["x"] for r in rows] == list(range(500))
    last = None
    for e, r in zip(events, rows):
        last = e.n_free if e.n_free is not None else last
        assert r["n_free"] == last
    rows, bucket = memmap.window_series(lt, 100, 400, 7)
    assert len(rows) <= 7 and bucket == 43
    for r in rows:
        seg = slice(r["x"], min(r["x"] + bucket, 400))
        assert r["used"] == lt.used[seg].max()


def test_state_at_is_the_same_reference_everywhere(imported):
    # state_at and states_at (the reference above) agree: the cross-check is not against itself twice
    store, ids = imported
    events = store.events(ids[0], 0)
    for n in (0, len(events) // 2, len(events)):
        assert states_at(events, [n])[n]["live"] == state_at(events, n)["live"]


rect = st.tuples(st.integers(0, 999), st.integers(1, 300), st.integers(0, 10_000), st.integers(1, 5_000))


@settings(max_examples=150, deadline=None)
@given(rects=st.lists(rect, max_size=400), win=st.tuples(st.integers(0, 900), st.integers(1, 1200),
                                                        st.integers(0, 9_000), st.integers(1, 12_000)),
       max_shapes=st.integers(1, 60))
def test_window_reduction_never_exceeds_its_budget(rects, win, max_shapes):
    x0, dx, y0, dy = win
    win = (x0, x0 + dx, y0, y0 + dy)
    s = np.array([r[0] for r in rects], dtype=np.int64)
    e = s + np.array([r[1] for r in rects], dtype=np.int64)
    a = np.array([r[2] for r in rects], dtype=np.int64)
    size = np.array([r[3] for r in rects], dtype=np.int64)
    n = len(rects)
    lt = memmap.Lifetimes(2000, s, e, a, a + size, a, size, np.zeros(n, dtype=np.int64),
                          np.array([f"t{i}" for i in range(n)], dtype=object), np.full(n, "ADD", dtype=object),
                          [], np.zeros(2000), np.zeros(2000), np.zeros(2000), np.zeros(2000))
    out = memmap.window_shapes(lt, win, max_shapes)
    visible = [i for i in range(n) if s[i] < win[1] and e[i] > win[0] and a[i] < win[3] and a[i] + size[i] > win[2]]
    assert out["count"] == len(out["shapes"]) <= max_shapes
    assert out["total_in_view"] == len(visible) == sum(sh["n"] for sh in out["shapes"])
    boxes = [(sh["x0"], sh["x1"], sh["y0"], sh["y1"]) for sh in out["shapes"]]
    for i in visible:  # every visible lifetime is drawn, alone or inside a merged box
        assert any(bx0 <= s[i] and e[i] <= bx1 and by0 <= a[i] and a[i] + size[i] <= by1
                   for bx0, bx1, by0, by1 in boxes)
    if len(visible) <= max_shapes:
        assert not out["reduced"]
        assert sorted(boxes) == sorted((int(s[i]), int(e[i]), int(a[i]), int(a[i] + size[i])) for i in visible)


def test_lru_builds_once_and_drops_the_oldest():
    cache = LRU(2)
    built = []

    def build(k):
        built.append(k)
        return k * 10

    assert cache.get(("a", 0), lambda: build(1)) == 10
    assert cache.get(("a", 0), lambda: build(99)) == 10
    cache.get(("b", 0), lambda: build(2))
    cache.get(("c", 0), lambda: build(3))
    assert cache.get(("a", 0), lambda: build(4)) == 40  # evicted, rebuilt
    cache.drop("a")
    assert cache.get(("a", 0), lambda: build(5)) == 50
    assert built == [1, 2, 3, 4, 5]


def test_the_grid_search_counts_occupied_cells_as_numbering_them_does():
    rng = np.random.default_rng(4)
    for g in (1, 2, 7, 64, 357, 1024):
        for n in (0, 1, 10, 5000, 300_000):
            cells = rng.integers(0, g * g, n) if rng.random() < 0.5 else rng.integers(0, max(1, g), n) * g
            assert memmap_view._count_occupied(cells, g) == len(memmap_view._occupied(cells, g)[0]) == len(np.unique(cells))


def test_lru_peek_never_builds():
    cache = LRU(2)
    assert cache.peek(("a", 0)) is None
    cache.get(("a", 0), lambda: 1)
    cache.get(("b", 0), lambda: 2)
    assert cache.peek(("a", 0)) == 1  # used now: "b" is the oldest
    cache.get(("c", 0), lambda: 3)
    assert cache.peek(("b", 0)) is None and cache.peek(("a", 0)) == 1
