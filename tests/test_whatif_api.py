"""The what-if API route and its dashboard panel (a real uvicorn and headless Chromium for the page).

Stored torch traces come from the snapshot source; here a loader maps trace ids to the fixture snapshots."""
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from alloctrace.traces.errors import UserError
from alloctrace.server.app import create_app
from alloctrace.traces.torch_whatif import load_snapshot_file

from torchsnap import DATA, sidecar

ROOT = Path(__file__).resolve().parent.parent
IDS = {"0000000a": "oom", "0000000b": "fragmentation", "0000000c": "small_default"}


def fixture_loader(store, trace_id, device):
    if trace_id not in IDS:
        from alloctrace.traces.store import NotFound
        raise NotFound(f"no trace {trace_id}")
    try:
        return load_snapshot_file(str(DATA / f"{IDS[trace_id]}.pickle.gz"), device)
    except ValueError as e:                  # the store answers a missing device with a UserError
        raise UserError(str(e)) from None


@pytest.fixture()
def client(tmp_path):
    app = create_app(store_dir=tmp_path)
    app.state.whatif_loader = fixture_loader
    with TestClient(app) as c:
        yield c


def test_whatif_route_real_and_whatif(client):
    r = client.get("/api/torch/traces/0000000a/devices/0/whatif",
                   params=[("set", "expandable_segments=true"), ("cap", "6GiB"), ("points", "200")])
    assert r.status_code == 200, r.text
    out = r.json()
    truth = sidecar("oom")["ground_truth"]
    assert out["real"]["consistent"] is True and out["real"]["peak_reserved"] == truth["max_memory_reserved"]
    assert out["real"]["oom"]["size"] == 48 << 20
    assert out["settings"]["expandable_segments"] is True and out["settings"]["memory_limit"] == 6 << 30
    s = out["series"]
    assert len(s["event"]) == len(s["real_reserved"]) == len(s["whatif_reserved"]) <= 200
    assert max(s["real_reserved"]) == truth["max_memory_reserved"]     # bucket maxima keep the peak
    assert max(s["whatif_reserved"]) == out["whatif"]["peak_reserved"]


@pytest.mark.parametrize("params,status", [
    ([("set", "nope=1")], 400), ([("cap", "lots")], 400), ([("points", "5")], 422), ([("set", "expandable")], 400),
])
def test_whatif_route_bad_input(client, params, status):
    r = client.get("/api/torch/traces/0000000c/devices/0/whatif", params=params)
    assert r.status_code == status and "detail" in r.json()


def test_whatif_route_unknown_trace_and_bad_id(client):
    assert client.get("/api/torch/traces/0000000f/devices/0/whatif").status_code == 404
    assert client.get("/api/torch/traces/xyz/devices/0/whatif").status_code == 422
    assert client.get("/api/torch/traces/0000000c/devices/3/whatif").status_code == 400   # one device only


def test_whatif_page_in_chromium(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(store_dir=tmp_path)
    app.state.whatif_loader = fixture_loader
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with playwright_api.sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
            pg = b.new_page(viewport={"width": 1300, "height": 900})
            errors = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(f"http://127.0.0.1:{port}/whatif?trace=0000000b&set=expandable_segments=true")
            pg.wait_for_selector("#wi-consistent", timeout=30000)
            assert "consistently" in pg.inner_text("#wi-consistent")
            cells = pg.locator(".whatif-table tbody tr").first.locator("td").all_inner_texts()
            assert cells[0] != cells[1]                   # expandable segments lower the peak reserved
            pg.wait_for_function("document.querySelector('#wi-plot-whatif').data !== undefined", timeout=30000)
            n = pg.evaluate("document.querySelector('#wi-plot-real').data[0].x.length")
            assert 10 <= n <= 600
            # a cap below what the program needs: the what-if run fails and the plot marks the OOM
            pg.fill("#wi-cap", "4GiB")
            pg.select_option("#wi-expandable_segments", "")
            pg.click("#wi-run")
            pg.wait_for_function("document.querySelector('#wi-plot-whatif').data.some(t => t.name === 'OOM')",
                                 timeout=30000)
            assert "fails at entry" in pg.inner_text("#whatif-result")
            (ROOT / "test-artifacts").mkdir(exist_ok=True)
            pg.screenshot(path=str(ROOT / "test-artifacts" / "web-whatif.png"), full_page=True)
            httpx.get(f"http://127.0.0.1:{port}/whatif").raise_for_status()
            b.close()
        assert errors == []
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
