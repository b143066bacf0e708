"""The HTTP API against a real uvicorn on a loopback port: uploads, browsing, diff, state, pages."""
from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn

from alloctrace.allocator.presets import PRESETS
from alloctrace.traces.replay.run import run_replay
from alloctrace.server.app import create_app
from alloctrace.server.api import with_ggml_lines
from alloctrace.traces.sources import import_paths
from alloctrace.traces.state.free_list import state_at
from alloctrace.traces.store.store import open_store

LEGACY_HARNESS = "v2023-08-16-legacy/harness_plain.AT.log"


class LiveServer:
    """uvicorn serving create_app(...) in a thread, on a socket bound before it starts."""

    def __init__(self, store_dir, **kw):
        self.app = create_app(store_dir, **kw)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", timeout_keep_alive=30))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    @property
    def upload_dir(self) -> Path:
        return self.app.state.ctx.upload_dir

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kw)


def upload(client, path: Path, name=None, filename=None):
    with open(path, "rb") as f:
        data = {"name": name} if name else {}
        return client.post("/api/traces", files={"file": (filename or path.name, f)}, data=data)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with LiveServer(tmp_path_factory.mktemp("store")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(live):
    with live.client() as c:
        yield c


@pytest.fixture(scope="module")
def legacy(client, fixtures):
    r = upload(client, fixtures / LEGACY_HARNESS, name="legacy harness")
    assert r.status_code == 201, r.text
    return r.json()["traces"][0]


def graphs_view(summary):
    return [(g["index"], g["role"], g["n_events"], g["max_size"], g["buffer_size"], g["oom"], g["consistent"])
            for g in summary["graphs"]]


def test_every_fixture_log_uploads_like_the_cli_imports_it(client, fixtures, tmp_path):
    logs = sorted(fixtures.rglob("*.log"))
    assert len(logs) >= 7
    reference = open_store(tmp_path / "cli")
    for path in logs:
        r = upload(client, path)
        assert r.status_code == 201, (path, r.text)
        body = r.json()
        assert set(body) == {"traces"} and len(body["traces"]) == 1
        got = body["traces"][0]
        [ref_id] = import_paths(reference, [path])
        want = reference.summary(ref_id)
        assert got["name"] == path.name
        assert got["source"] == "ggml-log"
        assert got["generation"] == want["generation"]
        assert graphs_view(got) == graphs_view(with_ggml_lines(want))  # the API adds ggml's own OOM line
        assert client.get(f"/api/traces/{got['id']}").json() == got


def test_uploaded_summaries_hold_the_sizes_ggml_printed(client, fixtures):
    # exact sizes from the fixtures' README (what the real programs measured)
    r = upload(client, fixtures / "v2023-08-16-legacy/gpt-2_tiny_short.AT.log").json()["traces"][0]
    sizes = [g["max_size"] for g in r["graphs"]]
    assert sizes == [102480] + [45136] * 5
    r = upload(client, fixtures / "v2023-08-28-parseseq/gpt-2_tiny_long.AT+DEBUG.log").json()["traces"][0]
    assert [g["max_size"] for g in r["graphs"]] == [360976] * 5


def test_legacy_harness_summary_reports_the_oom(legacy):
    measure, real = legacy["graphs"]
    assert (measure["role"], measure["max_size"], measure["oom"]) == ("measure", 12304, None)
    # and ggml's own words for it, as the log printed them (fixtures README)
    assert real["oom"] == {"tensor": "fc_b", "needed": 4096, "largest_available": 2064,
                           "ggml_line": "not enough space in the buffer (needed 4096, largest block available 2064)"}
    assert real["buffer_size"] == 12320


def test_diff_endpoint_reports_divergence_and_oom(client, legacy):
    tid = legacy["id"]
    r = client.get("/api/diff", params={"a": f"{tid}:0", "b": f"{tid}:1"})
    assert r.status_code == 200
    d = r.json()
    first = d["first_divergence"]
    assert first is not None
    # the measure run still has its endless tail; the real buffer's last block is finite and best fit moves on
    assert first["a"]["block"] != first["b"]["block"] or first["a"]["offset"] != first["b"]["offset"]
    assert d["a"]["oom"] is None
    oom = d["b"]["oom"]
    assert (oom["tensor"], oom["needed"], oom["largest_free"]) == ("fc_b", 4096, 2064)
    assert "4096" in oom["words"] and "2064" in oom["words"]


def test_diff_rejects_bad_refs(client, legacy):
    assert client.get("/api/diff", params={"a": "../etc", "b": "x"}).status_code == 422
    r = client.get("/api/diff", params={"a": f"{legacy['id']}:0", "b": "0000ffff:0"})
    assert r.status_code == 404 and "detail" in r.json()


def test_list_search_and_delete(client, fixtures):
    r = upload(client, fixtures / "v2023-08-28-parseseq/harness_parseseq.AT.log", name="zz-unique-name")
    tid = r.json()["traces"][0]["id"]
    hits = client.get("/api/traces", params={"q": "ZZ-UNIQUE"}).json()["traces"]
    assert [t["id"] for t in hits] == [tid]
    assert tid in [t["id"] for t in client.get("/api/traces").json()["traces"]]
    assert client.delete(f"/api/traces/{tid}").status_code == 200
    assert client.get(f"/api/traces/{tid}").status_code == 404
    assert client.delete(f"/api/traces/{tid}").status_code == 404
    assert tid not in [t["id"] for t in client.get("/api/traces").json()["traces"]]


def test_events_pages_match_the_store(client, live, legacy):
    tid = legacy["id"]
    events = open_store(Path(live.app.state.ctx.store.path).parent).events(tid, 1)
    pages, start = [], 0
    while True:
        r = client.get(f"/api/traces/{tid}/graphs/1/events", params={"start": start, "limit": 37}).json()
        assert r["total"] == len(events)
        if not r["events"]:
            break
        pages += r["events"]
        start += 37
    assert [e["i"] for e in pages] == list(range(len(events)))
    for row, ev in zip(pages, events):
        want = {"i": row["i"], **ev.to_dict()}
        if "block" in want and want["block"] == -1 and ev.kind != "alloc":
            want.pop("block")
        assert row == want
    frees = client.get(f"/api/traces/{tid}/graphs/1/events", params={"kind": "free", "limit": 5000}).json()
    assert frees["total"] == sum(e.kind == "free" for e in events)
    assert all(e["kind"] == "free" for e in frees["events"])
    one = client.get(f"/api/traces/{tid}/graphs/1/events", params={"tensor": "fc_b"}).json()
    assert one["total"] == sum(e.tensor == "fc_b" for e in events) > 0
    assert client.get(f"/api/traces/{tid}/graphs/1/events", params={"kind": "nope"}).status_code == 400
    assert client.get(f"/api/traces/{tid}/graphs/9/events").status_code == 404


def test_state_endpoint_is_state_at(client, live, legacy):
    tid = legacy["id"]
    events = open_store(Path(live.app.state.ctx.store.path).parent).events(tid, 1)
    for n in (0, 40, len(events) - 1, len(events)):
        got = client.get(f"/api/traces/{tid}/graphs/1/state", params={"event": n}).json()
        want = state_at(events, n, capacity=12320)
        assert [{k: v for k, v in t.items() if k != "op"} for t in got["live"]] == want["live"]
        # each live tensor carries the op of the event that placed it (the dashboard colours by it)
        placed_by = {e.tensor: e.op for e in events[:n] if e.kind in ("alloc", "reuse")}
        assert [t.get("op") for t in got["live"]] == [placed_by[t["tensor"]] for t in got["live"]]
        assert [(b["offset"], b["size"], b["chunk"]) for b in got["free_blocks"]] == \
            [tuple(b) for b in want["free_blocks"]]
    at_oom = client.get(f"/api/traces/{tid}/graphs/1/state", params={"event": len(events) - 1}).json()
    assert max(b["size"] for b in at_oom["free_blocks"]) == 2064
    assert client.get(f"/api/traces/{tid}/graphs/1/state", params={"event": len(events) + 1}).status_code == 400


def test_memory_map_marks_limits_and_oom(client, legacy):
    tid = legacy["id"]
    r = client.get(f"/api/traces/{tid}/graphs/1/memory-map").json()
    assert r["max_size"] == 12304 and r["buffer_size"] == 12320
    events = client.get(f"/api/traces/{tid}/graphs/1/events", params={"kind": "oom"}).json()["events"]
    assert r["oom"]["event"] == events[0]["i"]
    assert (r["oom"]["tensor"], r["oom"]["needed"], r["oom"]["largest_available"]) == ("fc_b", 4096, 2064)
    assert r["count"] == len(r["shapes"]) == r["total_in_view"] and not r["reduced"]
    assert all(s["y1"] <= 12320 for s in r["shapes"])
    assert len(r["free_list"]) == r["n_events"]
    small = client.get(f"/api/traces/{tid}/graphs/1/memory-map", params={"max_shapes": 3, "max_points": 7}).json()
    assert small["count"] <= 3 and small["reduced"] and len(small["free_list"]) <= 7
    assert sum(s["n"] for s in small["shapes"]) == r["count"]
    assert client.get(f"/api/traces/{tid}/graphs/1/memory-map", params={"x0": 5, "x1": 5}).status_code == 400


def test_tensor_names_stay_data(client, fixtures, tmp_path):
    text = (fixtures / LEGACY_HARNESS).read_text().replace("fc_b", "<img_src=x_onerror=alert(1)>")
    path = tmp_path / "evil.log"
    path.write_text(text)
    tid = upload(client, path, name="<script>alert(1)</script>").json()["traces"][0]["id"]
    r = client.get(f"/api/traces/{tid}")
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["name"] == "<script>alert(1)</script>"
    assert r.json()["graphs"][1]["oom"]["tensor"] == "<img_src=x_onerror=alert(1)>"


def test_uploads_are_named_by_form_or_file_never_by_path(client, fixtures):
    r = upload(client, fixtures / LEGACY_HARNESS, filename="../../etc/passwd.log").json()["traces"][0]
    assert r["name"] == "passwd.log" and r["source"] == "ggml-log"


def test_twenty_concurrent_uploads_are_all_stored(live, fixtures):
    paths = sorted(fixtures.rglob("*.log"))
    with live.client() as c:
        before = {t["id"] for t in c.get("/api/traces").json()["traces"]}

        def one(k):
            with live.client() as cc:
                return upload(cc, paths[k % len(paths)], name=f"concurrent-{k}")

        with ThreadPoolExecutor(20) as pool:
            results = list(pool.map(one, range(20)))
        assert [r.status_code for r in results] == [201] * 20
        ids = {r.json()["traces"][0]["id"] for r in results}
        assert len(ids) == 20
        after = {t["id"]: t["name"] for t in c.get("/api/traces").json()["traces"]}
        assert set(after) == before | ids
        assert sorted(after[i] for i in ids) == sorted(f"concurrent-{k}" for k in range(20))
    assert not list(live.upload_dir.iterdir())


@pytest.fixture()
def small_cap(tmp_path):
    with LiveServer(tmp_path / "store", max_upload_bytes=20_000) as srv:
        yield srv


def test_bad_and_oversized_uploads_change_nothing(small_cap, fixtures, tmp_path):
    with small_cap.client() as c:
        assert upload(c, fixtures / LEGACY_HARNESS).status_code == 201
        before = c.get("/api/traces").json()
        garbage = tmp_path / "garbage.log"
        garbage.write_bytes(bytes(range(256)) * 20)
        noise = tmp_path / "noise.log"
        noise.write_text("hello\nthis is not a ggml log\n" * 10)
        fake_gz = tmp_path / "fake.log.gz"
        fake_gz.write_bytes(b"\x1f\x8b" + b"not gzip at all" * 10)
        empty = tmp_path / "empty.log"
        empty.write_bytes(b"")
        cases = [
            (upload(c, fixtures / "v2023-08-16-legacy/gpt-2_tiny_short.AT.log"), 413),  # 73 KB > 20 KB cap
            (upload(c, garbage), 400),
            (upload(c, noise), 400),
            (upload(c, fake_gz), 400),
            (upload(c, empty), 400),
            (c.post("/api/traces", data={"name": "no file"}, files={"other": ("x", b"y")}), 400),
            (c.post("/api/traces", content=b"plain body", headers={"content-type": "text/plain"}), 415),
            (c.post("/api/traces", content=b"--xx\r\nContent-Disposition: form-data; name=\"file\"; "
                    b"filename=\"a.log\"\r\n\r\nggml_allocr_alloc: allocating x (16 bytes) - block 0\n",
                    headers={"content-type": "multipart/form-data; boundary=xx"}), 400),  # no closing boundary
        ]
        for r, status in cases:
            assert r.status_code == status, r.text
            assert isinstance(r.json()["detail"], str) and r.json()["detail"]
            assert "upload-" not in r.json()["detail"]  # the temp file's name never leaks
        assert c.get("/api/traces").json() == before
    assert not list(small_cap.upload_dir.iterdir())


def test_disconnect_mid_upload_leaves_nothing(small_cap, fixtures):
    with small_cap.client() as c:
        before = c.get("/api/traces").json()
    host, port = small_cap.url.rsplit("/", 1)[1].split(":")
    head = (b"POST /api/traces HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=bb\r\n"
            b"Content-Length: 15000\r\n\r\n--bb\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.log\""
            b"\r\n\r\n")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head + (fixtures / LEGACY_HARNESS).read_bytes()[:5000])
        deadline = time.monotonic() + 10
        while not list(small_cap.upload_dir.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.02)  # the part is being written to its temp file
        assert list(small_cap.upload_dir.iterdir())
    deadline = time.monotonic() + 10
    while list(small_cap.upload_dir.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not list(small_cap.upload_dir.iterdir())
    with small_cap.client() as c:
        assert c.get("/api/traces").json() == before


def test_restart_keeps_everything(tmp_path, fixtures):
    with LiveServer(tmp_path / "s") as srv, srv.client() as c:
        first = upload(c, fixtures / LEGACY_HARNESS).json()["traces"][0]
        listing = c.get("/api/traces").json()
    with LiveServer(tmp_path / "s") as srv, srv.client() as c:
        assert c.get("/api/traces").json() == listing
        assert c.get(f"/api/traces/{first['id']}").json() == first
        assert c.get(f"/api/traces/{first['id']}/graphs/1/memory-map").json()["oom"]["tensor"] == "fc_b"


def test_token_guards_the_api(tmp_path):
    with LiveServer(tmp_path / "s", token="s3cret") as srv, srv.client() as c:
        assert c.get("/api/traces").status_code == 401
        assert c.get("/api/traces", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/traces", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/api/traces", params={"token": "s3cret"}).status_code == 200
        # the API's description and its page need the token too
        assert c.get("/openapi.json").status_code == 401 and c.get("/docs").status_code == 401
        assert c.get("/openapi.json", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        page = c.get("/", params={"token": "s3cret"})
        assert "alloctrace_token=s3cret" in page.headers.get("set-cookie", "")
        assert c.get("/api/traces").status_code == 200  # the page's cookie now carries the token


def test_serve_refuses_a_public_address_without_token(capsys, monkeypatch):
    from alloctrace.cli import main
    monkeypatch.delenv("ALLOCTRACE_TOKEN", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "token" in err and err.count("\n") == 1


def test_pages_static_and_plotly(client, live, legacy):
    import plotly
    web = Path(__file__).resolve().parents[2] / "web"
    for route, file in [("/", "index.html"), (f"/traces/{legacy['id']}", "trace.html"), ("/diff", "diff.html"),
                        ("/replay", "replay.html")]:
        r = client.get(route)
        if (web / file).is_file():  # the page, its asset URLs versioned (tests/server/test_server_assets.py)
            version = live.app.state.assets.version
            assert r.status_code == 200
            served = re.sub(r'  <link rel="modulepreload" href="[^"]+">\n', "", r.text)  # test_server_assets.py
            assert served == (web / file).read_text().replace('"/static/', f'"/static/{version}/').replace(
                '"/vendor/plotly.min.js"', f'"/vendor/{plotly.__version__}/plotly.min.js"')
        else:
            assert r.status_code == 404
    for asset in sorted(web.glob("*.js"))[:3] + sorted(web.glob("*.css"))[:1]:
        r = client.get(f"/static/{asset.name}")
        assert r.status_code == 200 and r.content == asset.read_bytes()
    assert client.get("/static/../pyproject.toml").status_code == 404
    assert client.get("/static/%2e%2e/pyproject.toml").status_code == 404
    js = client.get("/vendor/plotly.min.js")
    assert js.status_code == 200
    assert js.content == (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


def test_missing_pages_404_cleanly(tmp_path):
    web = tmp_path / "web"
    web.mkdir()
    (web / "index.html").write_text("<p>home</p>")
    with LiveServer(tmp_path / "s", web_dir=web) as srv, srv.client() as c:
        assert c.get("/").text == "<p>home</p>"
        for route in ("/diff", "/replay", "/traces/0123abcd", "/traces/../../x", "/static/nope.js"):
            r = c.get(route)
            assert r.status_code == 404


def test_presets_endpoint_lists_every_preset(client):
    r = client.get("/api/presets").json()
    assert [p["name"] for p in r["presets"]] == list(PRESETS)
    from alloctrace.allocator.profiles import PROFILES
    # replay runs the programs of Aug 2023 only; the later allocators are listed as generations
    assert r["profiles"] == ["ggml-2023-08-16", "ggml-2023-08-22", "ggml-2023-08-28"]
    assert [g["name"] for g in r["generations"]] == list(PROFILES)
    assert {"ggml-2023-10", "ggml-2024-02", "ggml-2025-09", "ggml-head"} <= set(PROFILES)


def test_replay_endpoint_stores_both_graphs(client):
    body = {"preset": "gpt2-tiny", "profile": "ggml-2023-08-28", "n_ctx": 128, "n_batch": 8}
    r = client.post("/api/replay", json=body)
    assert r.status_code == 201, r.text
    got = r.json()
    want = run_replay("gpt2-tiny", "ggml-2023-08-28", n_ctx=128, n_batch=8)
    assert got["replay"]["measure"]["max_size"] == want["measure"]["max_size"]
    assert got["replay"]["eval"] == {**want["eval"], "trace_id": got["traces"][0]["id"]}
    [trace] = got["traces"]
    assert [g["role"] for g in trace["graphs"]] == ["measure", "eval"]
    assert trace["graphs"][0]["max_size"] == want["measure"]["max_size"]
    assert client.get(f"/api/traces/{trace['id']}").json() == trace
    bad = client.post("/api/replay", json={**body, "preset": "no-such-model"})
    assert bad.status_code == 400 and "no-such-model" in bad.json()["detail"]
    assert client.post("/api/replay", json={**body, "profile": "ggml-head"}).status_code == 400


def test_uploads_left_by_a_dead_server_are_removed_on_start(tmp_path, fixtures):
    store_dir = tmp_path / "s"
    open_store(store_dir).close()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = store_dir / "uploads" / f"{dead.pid}-0000"
    stale.mkdir(parents=True)
    (stale / "upload-abcd.part").write_bytes(b"half a log")
    with LiveServer(store_dir) as srv, srv.client() as c:
        assert not stale.exists()
        assert srv.upload_dir.parent == store_dir / "uploads"
        assert c.get("/api/traces").json() == {"traces": []}


def test_gzip_and_zstd_uploads_import_like_plain(client, fixtures, tmp_path, legacy):
    import gzip

    import zstandard
    raw = (fixtures / LEGACY_HARNESS).read_bytes()
    gz, zst = tmp_path / "h.log.gz", tmp_path / "h.log.zst"
    gz.write_bytes(gzip.compress(raw))
    zst.write_bytes(zstandard.ZstdCompressor().compress(raw))
    for path in (gz, zst):
        r = upload(client, path)
        assert r.status_code == 201, r.text
        assert graphs_view(r.json()["traces"][0]) == graphs_view(legacy)
    truncated = tmp_path / "cut.log.gz"
    truncated.write_bytes(gzip.compress(raw)[:200])
    r = upload(client, truncated)
    assert r.status_code == 400 and "cut.log.gz" in r.json()["detail"]


def test_state_checkpoints_give_state_at_in_any_order(live, legacy, monkeypatch):
    import random

    from alloctrace.traces.state.index import StateIndex
    store = live.app.state.ctx.store
    tid = legacy["id"]
    events = store.events(tid, 1)
    monkeypatch.setattr(StateIndex, "step", 7)
    index = StateIndex(store.columns(tid, 1), 12320)
    points = list(range(len(events) + 1))
    random.Random(2).shuffle(points)
    for n in points:
        assert index.state(n) == state_at(events, n, capacity=12320), n
    # checkpoints are at least `step` events apart, and at least as far apart as the state they copy is large
    marks = sorted(index.checkpoints)
    assert len(marks) >= 2
    for a, b in zip(marks, marks[1:]):
        assert b == index._next_mark(index.checkpoints[a])


@pytest.mark.parametrize("compress", [None, "gz"])
def test_a_jsonl_export_round_trips_through_the_upload_endpoint(client, fixtures, tmp_path, compress):
    """The upload takes every input the CLI's import takes: here our own JSON Lines export, plain or gzipped."""
    import gzip
    import io

    from alloctrace.traces.export.ggml import export

    src = open_store(tmp_path / "src")
    [tid] = import_paths(src, [fixtures / "v2023-08-28-parseseq" / "harness_parseseq.AT.log"])
    buf = io.StringIO()
    export(src, tid, "jsonl", buf)
    data = buf.getvalue().encode()
    path = tmp_path / ("t.jsonl" + (".gz" if compress else ""))
    path.write_bytes(gzip.compress(data) if compress else data)
    r = upload(client, path, name="round trip")
    assert r.status_code == 201, r.text
    got = r.json()["traces"][0]
    want = src.summary(tid)
    assert got["name"] == "round trip" and got["id"] == tid  # kept: this store has no trace by that id
    assert (got["source"], got["generation"], got["graphs"]) == (want["source"], want["generation"], want["graphs"])
    n = want["graphs"][1]["n_events"]
    page = client.get(f"/api/traces/{got['id']}/graphs/1/events", params={"limit": n}).json()["events"]
    assert len(page) == n
    assert [(e["kind"], e.get("tensor"), e.get("offset"), e.get("size")) for e in page] == \
        [(e.kind, e.tensor, e.offset, e.size) for e in src.events(tid, 1)]


def test_an_upload_no_source_reads_is_refused_naming_the_file(client, tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"type": "trace", "version": 1}\n')
    r = upload(client, bad)
    assert r.status_code == 400 and "notes.jsonl" in r.json()["detail"] and "name" in r.json()["detail"]
