"""memory-map on a million-event graph over HTTP: never more shapes than asked for."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store
from test_memmap import synthetic_events
from test_server import LiveServer

N_EVENTS = 1_000_000


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A stored 1M-event graph (added to the store directly) and a server over that store."""
    d = tmp_path_factory.mktemp("big")
    events = synthetic_events(N_EVENTS, seed=11)
    kinds = Counter(e.kind for e in events)
    store = open_store(d)
    tid = store.add_trace(TraceMeta("synthetic 1M", "synthetic", "ggml-head"),
                          [GraphRecord(0, "reserve", events, max_size=4096 << 20)])
    store.close()
    del events
    with LiveServer(d) as srv, srv.client() as c:
        yield c, tid, kinds


def test_whole_graph_is_reduced_to_the_budget(big):
    c, tid, kinds = big
    for max_shapes in (1, 50, 2000, 20000):
        r = c.get(f"/api/traces/{tid}/graphs/0/memory-map", params={"max_shapes": max_shapes})
        assert r.status_code == 200
        m = r.json()
        assert m["n_events"] == N_EVENTS
        assert m["count"] == len(m["shapes"]) <= max_shapes
        # every alloc, reuse and free_extra starts one lifetime; all are in the full view
        assert m["total_in_view"] == kinds["alloc"] + kinds["reuse"] + kinds["free_extra"]
        assert sum(s["n"] for s in m["shapes"]) == m["total_in_view"]
        assert m["reduced"] and len(m["free_list"]) <= 1000


def test_random_windows_stay_within_budget(big):
    c, tid, _ = big
    rng = random.Random(5)
    top = 4096 << 20
    for _ in range(12):
        x0 = rng.randrange(0, N_EVENTS - 10)
        x1 = rng.randrange(x0 + 1, min(N_EVENTS, x0 + rng.choice([100, 10_000, 1_000_000])) + 1)
        y0 = rng.randrange(0, top - 1)
        y1 = rng.randrange(y0 + 1, top + 1)
        max_shapes = rng.choice([1, 7, 300, 3000])
        m = c.get(f"/api/traces/{tid}/graphs/0/memory-map",
                  params={"x0": x0, "x1": x1, "y0": y0, "y1": y1, "max_shapes": max_shapes, "max_points": 50}).json()
        assert m["count"] == len(m["shapes"]) <= max_shapes
        assert sum(s["n"] for s in m["shapes"]) == m["total_in_view"]
        assert m["reduced"] == (m["total_in_view"] > max_shapes)
        assert len(m["free_list"]) <= 50
        assert all(s["x0"] < x1 and s["x1"] > x0 and s["y0"] < y1 and s["y1"] > y0 for s in m["shapes"])


def test_events_pages_on_a_big_graph(big):
    c, tid, kinds = big
    r = c.get(f"/api/traces/{tid}/graphs/0/events", params={"start": 999_990, "limit": 50}).json()
    assert r["total"] == N_EVENTS and [e["i"] for e in r["events"]] == list(range(999_990, N_EVENTS))
    r = c.get(f"/api/traces/{tid}/graphs/0/events", params={"kind": "free_extra", "limit": 3}).json()
    assert r["total"] == kinds["free_extra"] and all(e["kind"] == "free_extra" for e in r["events"])
