"""The memory-map fast path (server/mapjson_fast.py) answers exactly as the FastAPI route does: the same
bytes and headers for every window it takes, and every request it does not take (bad, repeated or
odd parameters, empty windows, unknown traces, cold graphs) still gets the route's own answer."""
from __future__ import annotations

import random
import threading

import pytest
from fastapi.testclient import TestClient

from alloctrace.server import mapjson_fast
from alloctrace.server.app import create_app
from alloctrace.server.mapjson_fast import MemoryMapFastPath
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store
from test_memmap import synthetic_events
from test_server_mapjson import ODD_NAMES

N_EVENTS = 60_000


def route_only_app(store_dir, **kw):
    """The same server without the fast path: every map request goes through FastAPI's route."""
    app = create_app(store_dir, **kw)
    app.user_middleware = [m for m in app.user_middleware if m.cls is not MemoryMapFastPath]
    return app


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    d = tmp_path_factory.mktemp("fast")
    events = synthetic_events(N_EVENTS, seed=3)
    for k, e in enumerate(events[:3000]):  # names the JSON must escape
        if e.kind == "alloc":
            e.tensor = ODD_NAMES[k % len(ODD_NAMES)]
    store = open_store(d)
    tid = store.add_trace(TraceMeta("fast path", "synthetic", "ggml-head"),
                          [GraphRecord(0, "reserve", events, max_size=4096 << 20)])
    store.close()
    return d, tid


@pytest.fixture(scope="module")
def clients(stored):
    d, _ = stored
    with TestClient(create_app(d)) as fast, TestClient(route_only_app(d)) as slow:
        yield fast, slow


@pytest.fixture
def taken(monkeypatch):
    """How many requests the fast path answered itself / passed on to the route."""
    seen = {"fast": 0, "route": 0}
    answer = MemoryMapFastPath.answer

    async def counting(self, *a):
        body = await answer(self, *a)
        seen["fast" if body is not None else "route"] += 1
        return body

    monkeypatch.setattr(MemoryMapFastPath, "answer", counting)
    return seen


def same_answer(fast, slow, url: str):
    a, b = fast.get(url), slow.get(url)
    assert (a.status_code, a.content) == (b.status_code, b.content), url
    assert {k: v for k, v in a.headers.items()} == {k: v for k, v in b.headers.items()}, url
    return a


def test_warm_windows_are_the_routes_bytes(stored, clients, taken):
    (_, tid), (fast, slow) = stored, clients
    base = f"/api/traces/{tid}/graphs/0/memory-map"
    top = fast.get(base).json()["window"]["y1"]  # the first view builds the graph (through the route)
    rng = random.Random(4)
    urls = [base, base + "?max_shapes=20000&max_points=10000", base + "?max_shapes=1&max_points=1"]
    for _ in range(60):
        width = max(1, N_EVENTS // rng.choice([1, 3, 10, 100, 1000, 10000]))
        x0 = rng.randrange(0, N_EVENTS - width + 1)
        height = max(1, top // rng.choice([1, 4, 64, 4096]))
        y0 = rng.randrange(0, top - height + 1)
        q = f"x0={x0}&x1={x0 + width}&y0={y0}&y1={y0 + height}"
        q += rng.choice(["", "&max_shapes=2000&max_points=1000", f"&max_shapes={rng.randrange(1, 5000)}",
                         f"&max_points={rng.randrange(1, 9000)}&max_shapes=7", "&token=x&other=1"])
        urls.append(f"{base}?{q}")
    seen = set()
    for url in urls:
        r = same_answer(fast, slow, url)
        assert r.status_code == 200
        seen.add((r.json()["reduced"], r.json()["count"] > 0))
    assert seen >= {(True, True), (False, True)}  # tiles or grids, and exact answers
    assert taken["fast"] == len(urls) and taken["route"] == 1  # only the cold first view took the route


ODD_QUERIES = ["x0=-1", "x0=abc", "x0=", "x0=1e3", "x0=%2B5", "x0=05", "x0=%205", "x1=0", "y1=0",
               "max_shapes=0", "max_shapes=20001", "max_points=10001", "x0=5&x0=6", "x0=10&x1=10",
               "y0=9&y1=3", "x0=99999999999999999999999", "x0=1_000", "%78%30=7", "x1=5&x1=5"]


def test_odd_requests_get_the_routes_answer(stored, clients, taken):
    (_, tid), (fast, slow) = stored, clients
    base = f"/api/traces/{tid}/graphs/0/memory-map"
    fast.get(base)  # warm
    codes = set()
    for q in ODD_QUERIES:
        codes.add(same_answer(fast, slow, f"{base}?{q}").status_code)
    assert codes >= {200, 400, 422}
    for url in (f"/api/traces/{tid}/graphs/7/memory-map", f"/api/traces/{tid}/graphs/01/memory-map",
                f"/api/traces/{tid}/graphs/1000001/memory-map", "/api/traces/0000abcd/graphs/0/memory-map",
                f"/api/traces/{tid.upper()}/graphs/0/memory-map"):
        assert same_answer(fast, slow, url).status_code >= 400
    same_answer(fast, slow, f"{base}/")  # the route's redirect
    # a percent-encoded key is the parameter; a value no int parser reads differently is taken
    assert taken["fast"] >= 2


def test_a_trace_deleted_by_another_process_is_not_answered_from_cache(tmp_path, taken):
    d = tmp_path / "s"
    store = open_store(d)
    tid = store.add_trace(TraceMeta("gone", "synthetic", "ggml-head"),
                          [GraphRecord(0, "reserve", synthetic_events(5000, seed=1), max_size=1 << 30)])
    url = f"/api/traces/{tid}/graphs/0/memory-map?x0=0&x1=100"
    with TestClient(create_app(d)) as c:
        assert c.get(url).status_code == 200 and c.get(url).status_code == 200
        assert taken["fast"] == 1
        store.delete(tid)  # another connection: the server learns of it from the store's generation
        r = c.get(url)
        assert r.status_code == 404 and "detail" in r.json()
    store.close()


def test_a_busy_store_is_not_waited_for_on_the_event_loop(stored):
    d, tid = stored
    app = create_app(d)
    ctx = app.state.ctx
    ctx.fresh()
    assert ctx.fresh_now()
    held, release = threading.Event(), threading.Event()

    def long_read():
        with ctx.store._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=long_read)
    t.start()
    held.wait(10)
    try:
        assert not ctx.fresh_now()  # the fast path hands such a request to the route, which waits
    finally:
        release.set()
        t.join()
    assert ctx.fresh_now()
    ctx.close()


def test_query_params_reads_only_plain_numbers_in_bounds():
    assert mapjson_fast.query_params(b"") == {"x0": None, "x1": None, "y0": None, "y1": None,
                                         "max_shapes": 2000, "max_points": 1000}
    assert mapjson_fast.query_params(b"x0=3&x1=9&max_shapes=20000&q=anything")["max_shapes"] == 20000
    for bad in (b"x0=3&x0=3", b"x0=+3", b"x0=03", b"max_points=0", b"max_points=10001", b"y1=0", b"x1="):
        assert mapjson_fast.query_params(bad) is None, bad


def test_the_guards_still_come_first(stored, taken):
    d, tid = stored
    url = f"/api/traces/{tid}/graphs/0/memory-map?x0=0&x1=500"
    with TestClient(create_app(d, token="s3cret")) as c:
        assert c.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for _ in range(2):  # warm now, yet still refused without the token or from a foreign Host
            r = c.get(url)
            assert r.status_code == 401 and r.json() == {"detail": "missing or wrong token"}
        assert c.get(url + "&token=s3cret").status_code == 200
    with TestClient(create_app(d, hosts={"127.0.0.1"}), base_url="http://127.0.0.1") as c:
        assert c.get(url).status_code == 200 and c.get(url).status_code == 200
        assert c.get(url, headers={"Host": "evil.example"}).status_code == 403
    assert taken["fast"] == 2  # the warm requests that got through the guards
