"""GET /api/traces/{id}/export: the dashboard's download of a whole trace, in every export format."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.server.app import create_app
from alloctrace.traces.sources.jsonl import read_jsonl


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(store_dir=tmp_path_factory.mktemp("store"))) as c:
        yield c


def test_export_downloads_every_format(client):
    store = client.app.state.ctx.store
    log = Path(__file__).resolve().parents[2] / "server" / "examples" / "harness_plain-ggml-2023-08-16.AT.log"
    with open(log, "rb") as f:
        tid = client.post("/api/traces", files={"file": (log.name, f)}).json()["traces"][0]["id"]
    chrome = client.get(f"/api/traces/{tid}/export", params={"format": "chrome"})
    assert chrome.status_code == 200 and chrome.headers["content-disposition"] == f'attachment; filename="trace-{tid}.chrome.json"'
    assert {"fc_b", "KQV"} <= {e.get("name") for e in chrome.json()["traceEvents"]}
    jsonl = client.get(f"/api/traces/{tid}/export", params={"format": "jsonl"})
    meta, graphs = read_jsonl(jsonl.text.splitlines())
    graphs = list(graphs)
    assert [len(g.events) for g in graphs] == [len(store.events(tid, g["index"])) for g in store.summary(tid)["graphs"]]
    csv = client.get(f"/api/traces/{tid}/export", params={"format": "csv"})
    assert csv.headers["content-type"].startswith("text/csv") and csv.text.count("\n") == 1 + sum(
        len(store.events(tid, g["index"])) for g in store.summary(tid)["graphs"])
    assert "content-length" not in csv.headers  # streamed graph by graph, not sized in advance
    assert client.get(f"/api/traces/{tid}/export", params={"format": "pdf"}).status_code == 422
    assert client.get("/api/traces/0000dead/export").status_code == 404
