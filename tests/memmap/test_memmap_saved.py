"""A long graph's lifetimes and tile pyramid stored with it (traces/memmap/saved.py) give exactly the
memory-map answers of the ones the server builds on the first view: the same bytes for many windows,
through the FastAPI route and the fast path, on a synthetic graph and on the real logs. The stored
value goes with its trace, is made only for long graphs of ggml events, and an older store (without
the table) is answered by building, as before."""
from __future__ import annotations

import random
import sqlite3

import numpy as np
import pytest
import zstandard
from fastapi.testclient import TestClient

from alloctrace.server.app import create_app
from alloctrace.traces import memmap
from alloctrace.traces.memmap import saved as memmap_saved
from alloctrace.traces.state import index as state_index_mod
from alloctrace.traces.store import store as store_mod
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from test_memmap import columns_of, synthetic_events
from test_server_mapjson_fast import route_only_app
from test_server_mapjson import ODD_NAMES
from test_state_checkpoints import DATA, REAL_LOGS

LONG = 100  # the stored-pyramid threshold in these tests (SAVED_MIN_EVENTS is 50,000): the real logs' graphs
# are a few hundred events, some shorter


def synthetic_graph(n=20_000, seed=5) -> GraphRecord:
    events = synthetic_events(n, seed=seed)
    for k, e in enumerate(events[:2000]):  # names the JSON must escape, and some None names
        if e.kind == "alloc":
            e.tensor = ODD_NAMES[k % len(ODD_NAMES)]
            e.op = None if k % 7 == 0 else e.op
    return GraphRecord(0, "reserve", events, max_size=4096 << 20)


def fill(d, threshold: int):
    """A store in `d` holding the synthetic graph and every real log, stored with SAVED_MIN_EVENTS = threshold."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_mod, "SAVED_MIN_EVENTS", threshold)
        store = open_store(d)
        ids = [store.add_trace(TraceMeta("synthetic", "synthetic", "ggml-head"), [synthetic_graph()])]
        ids += import_paths(store, REAL_LOGS)
        graphs = [(tid, row["index"], row["n_events"]) for tid in ids for row in store.summary(tid)["graphs"]]
        stored = store.db.execute("SELECT count(*) FROM memmap_lod").fetchone()[0]
        store.close()
    return graphs, stored


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    saved_dir, built_dir = tmp_path_factory.mktemp("saved"), tmp_path_factory.mktemp("built")
    saved, n_saved = fill(saved_dir, LONG)
    built, n_built = fill(built_dir, 10 ** 9)
    assert n_built == 0 and n_saved == sum(n >= LONG for _, _, n in saved) > 1
    return saved_dir, saved, built_dir, built


def windows(n: int, top: int, rng: random.Random, count: int):
    yield {}
    yield {"max_shapes": 1, "max_points": 1}
    for _ in range(count):
        zoom = rng.choice([1, 3, 30, 300, 3000])
        w, h = max(1, n // zoom), max(1, top // zoom)
        x0, y0 = rng.randrange(0, max(1, n - w + 1)), rng.randrange(0, max(1, top - h + 1))
        yield {"x0": x0, "x1": x0 + w, "y0": y0, "y1": y0 + h, "max_shapes": rng.choice([10, 200, 2000, 20000]),
               "max_points": rng.choice([5, 1000, 10000])}


def test_stored_pyramid_answers_as_the_built_one(stores):
    saved_dir, saved, built_dir, built = stores
    rng = random.Random(0)
    with TestClient(create_app(saved_dir)) as fast, TestClient(route_only_app(saved_dir)) as route, \
            TestClient(create_app(built_dir)) as reference:
        for (tid, g, n), (ref_tid, ref_g, ref_n) in zip(saved, built):
            assert (g, n) == (ref_g, ref_n)
            got_first = fast.get(f"/api/traces/{tid}/graphs/{g}/memory-map")  # cold: the route loads or builds
            want_first = reference.get(f"/api/traces/{ref_tid}/graphs/{g}/memory-map")
            assert got_first.status_code == 200 and got_first.content == want_first.content
            top = want_first.json()["window"]["y1"]
            for params in windows(n, top, rng, 15 if n >= LONG else 3):
                want = reference.get(f"/api/traces/{ref_tid}/graphs/{g}/memory-map", params=params).content
                assert fast.get(f"/api/traces/{tid}/graphs/{g}/memory-map", params=params).content == want, params
                assert route.get(f"/api/traces/{tid}/graphs/{g}/memory-map", params=params).content == want, params


def test_first_view_loads_instead_of_building(stores, monkeypatch):
    """A graph with stored lifetimes is neither extracted nor decoded whole on its first view; one
    without them (the same graph, stored with a higher threshold) is built from its columns."""
    saved_dir, saved, built_dir, built = stores
    extracted = []
    extract = memmap.extract
    monkeypatch.setattr(memmap, "extract", lambda cols: extracted.append(1) or extract(cols))
    for d, graphs, want in ((saved_dir, saved, []), (built_dir, built, [1])):
        tid, g, _ = graphs[0]  # the synthetic graph
        with TestClient(create_app(d)) as client:
            assert client.get(f"/api/traces/{tid}/graphs/{g}/memory-map").status_code == 200
            assert (client.app.state.ctx.columns_cache.peek((tid, g)) is None) == (not want)
        assert extracted == want


def test_round_trip_keeps_every_array():
    cols = columns_of(synthetic_graph(5000, seed=9).events)
    lt = memmap_saved.lod_of(cols)
    back = memmap_saved.decode(memmap_saved.encode(lt, zstandard.ZstdCompressor()))

    def same(a, b):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")

    for name in memmap_saved.LIFETIME_ARRAYS + memmap_saved.NAME_COLUMNS:
        same(getattr(lt, name), getattr(back, name))
    assert (back.n_events, back.chunks, back.y_extent) == (lt.n_events, lt.chunks, lt.y_extent)
    assert len(back.lod.levels) == len(lt.lod.levels)
    for a, b in zip(lt.lod.levels, back.lod.levels):
        for name in memmap_saved.LEVEL_ARRAYS:
            same(getattr(a, name), getattr(b, name))
    for a, b in zip((lt.lod.members, lt.lod.first, *lt.lod.columns), (back.lod.members, back.lod.first,
                                                                      *back.lod.columns)):
        same(a, b)
    for a, b in zip(lt.lod.series, back.lod.series, strict=True):
        for x, y in zip(a, b):
            same(x, y)


def test_deleted_with_its_trace_and_kept_only_for_ggml_events(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", LONG)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("a", "synthetic", "ggml-head"), [synthetic_graph(3000)])
    (torch_id,) = import_paths(store, [DATA / "torch" / "oom.pickle.gz"])  # allocator entries: no map pyramid
    assert store.db.execute("SELECT trace_id FROM memmap_lod").fetchall() == [(tid,)]
    assert store.saved_lifetimes(tid, 0) is not None and store.saved_lifetimes(torch_id, 0) is None
    store.delete(tid)
    assert store.db.execute("SELECT count(*) FROM memmap_lod").fetchone()[0] == 0
    store.close()


def test_older_store_builds_on_view_and_keeps_them(tmp_path, monkeypatch):
    """A store from before the table: opened, it gains it; the first view builds the lifetimes and the
    server stores them meanwhile, so the next server loads them and answers the same bytes."""
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", 10 ** 9)
    monkeypatch.setattr(state_index_mod, "SAVED_MIN_EVENTS", LONG)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("old", "synthetic", "ggml-head"), [synthetic_graph(3000)])
    store.close()
    db = sqlite3.connect(tmp_path / store_mod.DB_NAME)
    db.execute("DROP TABLE memmap_lod")  # the schema before this table existed
    db.commit()
    db.close()
    store = open_store(tmp_path)
    assert store.saved_lifetimes(tid, 0) is None
    store.close()
    urls = [f"/api/traces/{tid}/graphs/0/memory-map?" + "&".join(f"{k}={v}" for k, v in p.items())
            for p in windows(3000, 1 << 32, random.Random(1), 10)]
    with TestClient(create_app(tmp_path)) as client:
        built = [client.get(u).content for u in urls]
        client.app.state.ctx.keeping.join(60)
    store = open_store(tmp_path)
    assert store.saved_lifetimes(tid, 0) is not None
    assert not store.add_saved_lifetimes(tid, 0, b"")  # kept once
    store.close()
    with TestClient(create_app(tmp_path)) as client:
        assert [client.get(u).content for u in urls] == built
        assert client.app.state.ctx.keeping is None  # loaded, not built again


def test_a_map_of_too_many_lifetimes_waits_for_the_first_view(tmp_path, monkeypatch):
    """A graph opening more than SAVED_MAX_LIFETIMES lifetimes is stored with its checkpoints but without
    its map (building it would take the import past its memory bound); the first view builds it, the same
    bytes, and keeps it for the next server."""
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", LONG)
    graph = synthetic_graph(3000)
    opened = sum(e.kind in ("alloc", "reuse") for e in graph.events)
    monkeypatch.setattr(memmap_saved, "SAVED_MAX_LIFETIMES", opened - 1)
    store = open_store(tmp_path / "over")
    tid = store.add_trace(TraceMeta("a", "synthetic", "ggml-head"), [graph])
    assert store.saved_lifetimes(tid, 0) is None and store.saved_states(tid, 0) is not None
    store.close()
    monkeypatch.setattr(memmap_saved, "SAVED_MAX_LIFETIMES", opened)
    under = open_store(tmp_path / "under")
    tid2 = under.add_trace(TraceMeta("a", "synthetic", "ggml-head"), [synthetic_graph(3000)])
    assert under.saved_lifetimes(tid2, 0) is not None
    under.close()
    monkeypatch.setattr(state_index_mod, "SAVED_MIN_EVENTS", LONG)
    with TestClient(create_app(tmp_path / "over")) as client:
        built = client.get(f"/api/traces/{tid}/graphs/0/memory-map").content
        client.app.state.ctx.keeping.join(60)
    with TestClient(create_app(tmp_path / "under")) as client:
        assert client.get(f"/api/traces/{tid2}/graphs/0/memory-map").content == built
    again = open_store(tmp_path / "over")
    assert again.saved_lifetimes(tid, 0) is not None
    again.close()


def test_unreadable_value_is_built_instead(tmp_path, monkeypatch):
    """A stored value that cannot be read (damaged) does not fail the view: the map is built, the same."""
    monkeypatch.setattr(store_mod, "SAVED_MIN_EVENTS", LONG)
    store = open_store(tmp_path)
    tid = store.add_trace(TraceMeta("a", "synthetic", "ggml-head"), [synthetic_graph(3000)])
    with TestClient(create_app(tmp_path)) as client:
        want = client.get(f"/api/traces/{tid}/graphs/0/memory-map").content
    store.db.execute("UPDATE memmap_lod SET data = substr(data, 1, 100)")
    store.close()
    with TestClient(create_app(tmp_path)) as client:
        assert client.get(f"/api/traces/{tid}/graphs/0/memory-map").content == want
        assert client.get("/api/traces/00000000/graphs/0/memory-map").status_code == 404


@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 8, 33])
def test_series_pairs_reduce_as_reduceat(m):
    """The series levels (rebuilt on every load) pair buckets as fn.reduceat over aligned pairs did."""
    from alloctrace.traces.memmap.lod import _pairs
    rng = np.random.default_rng(m)
    a = rng.integers(0, 9, m).astype(np.float64)
    a[rng.random(m) < 0.3] = np.nan
    for fn in (np.fmax, np.fmin):
        want = fn.reduceat(a, np.arange(0, m, 2))
        got = _pairs(fn, a)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)
