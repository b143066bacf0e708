"""The torch HTTP API: uploads (the torch route and the generic one), views, and refusals as 4xx JSON."""
import gzip
import json
import os
import pickle
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.allocator.events import Event
from alloctrace.server.app import create_app
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"


def sidecar(name):
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    s = open_store(d)
    ggml = s.add_trace(TraceMeta(name="ggml", source="test", generation="ggml-2023-08-16"),
                       [GraphRecord(0, "eval", [Event("graph")])])
    s.close()
    with TestClient(create_app(store_dir=d)) as c:
        c.ggml = ggml
        c.ids = {}
        for name in ("oom", "gpt2_train_bs8"):
            with open(DATA / f"{name}.pickle.gz", "rb") as f:
                r = c.post("/api/torch/traces", files={"file": (f"dir/{name}.pickle.gz", f)}, data={"name": name})
            assert r.status_code == 201, r.text
            (t,) = r.json()["traces"]
            assert t["name"] == name and t["source"] == "torch"
            c.ids[name] = t["id"]
        yield c


def count(c):
    return len(c.get("/api/traces").json()["traces"])


def test_upload_reports_the_import_json_shape(app):
    s = app.get(f"/api/torch/traces/{app.ids['oom']}").json()
    (d,) = s["devices"]
    truth = sidecar("oom")
    assert d["peak_requested"] == truth["memory_stats_subset"]["requested_bytes.all.peak"]
    assert d["peak_reserved"] == truth["ground_truth"]["max_memory_reserved"]
    assert d["oom"]["allocated"] == truth["ground_truth"]["memory_allocated"]
    assert d["oom_events"] == [truth["snapshot_analysis"]["trace_entries_per_device"][0] - 1]
    assert d["trace_matches_snapshot"] is True


def test_the_generic_upload_takes_snapshots_too(app):
    before = count(app)
    with open(DATA / "fragmentation.pickle.gz", "rb") as f:
        r = app.post("/api/traces", files={"file": ("frag.pickle.gz", f)})
    assert r.status_code == 201, r.text
    (t,) = r.json()["traces"]
    assert t["source"] == "torch" and t["graphs"][0]["buffer_size"] == \
        sidecar("fragmentation")["ground_truth"]["max_memory_reserved"]
    assert count(app) == before + 1
    assert app.delete(f"/api/traces/{t['id']}").status_code == 200


class Evil:
    def __reduce__(self):
        return (os.system, ("echo owned > /tmp/alloctrace-torch-api-owned",))


@pytest.mark.parametrize("route", ["/api/torch/traces", "/api/traces"])
def test_code_running_and_broken_uploads_are_refused(app, route, tmp_path):
    before = count(app)
    marker = Path("/tmp/alloctrace-torch-api-owned")
    marker.unlink(missing_ok=True)
    evil = pickle.dumps({"segments": [], "device_traces": [[Evil()]]}, protocol=4)
    real = gzip.decompress((DATA / "oom.pickle.gz").read_bytes())
    for blob in (evil, gzip.compress(evil), real[: len(real) // 2]):
        r = app.post(route, files={"file": ("snap.pickle", blob)})
        assert 400 <= r.status_code < 500, r.text
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and str(tmp_path) not in detail
    assert not marker.exists()
    assert count(app) == before


def test_views_answer_and_bad_requests_are_4xx(app):
    tid = app.ids["oom"]
    base = f"/api/torch/traces/{tid}/devices/0"
    t = app.get(f"{base}/timeline?max_points=50&max_bands=10").json()
    assert len(t["grid"]) <= 50 and len(t["bands"]) == 10
    z = app.get(f"{base}/timeline?x0=100&x1=200").json()
    assert (z["x0"], z["x1"]) == (100, 200)
    n = t["n_events"]
    st = app.get(f"{base}/state?event={n - 1}").json()
    assert st["next"]["action"] == "oom"
    assert st["totals"]["reserved"] == sidecar("oom")["ground_truth"]["memory_reserved"]
    assert app.get(f"{base}/oom").json()["oom"]["event"] == n - 1
    p = app.get(f"{base}/peak?top=3").json()
    assert len(p["by_call_site"]) == 4 and sum(g["bytes"] for g in p["by_call_site"]) == p["peak_requested"]
    assert app.get(f"{base}/entries?start={n - 1}&limit=5").json()["entries"][0]["action"] == "oom"
    d = app.get(f"/api/torch/diff?a={app.ids['gpt2_train_bs8']}&b={tid}:0").json()
    assert d["decomposition"]["total"] == d["delta_requested"]
    assert app.get(f"{base}/state?event={n + 1}").status_code == 400
    assert app.get(f"{base}/timeline?x0=50&x1=10").status_code == 400
    assert app.get(f"/api/torch/traces/{tid}/devices/7/peak").status_code == 404
    assert app.get("/api/torch/traces/0000ffff/devices/0/peak").status_code == 404
    assert app.get("/api/torch/traces/not-an-id").status_code == 422
    assert app.get(f"/api/torch/traces/{app.ggml}/devices/0/peak").status_code == 400
    assert app.get("/api/torch/diff?a=zz&b=yy").status_code == 422
    assert app.get("/torch").status_code == 200
    r = app.get(f"/traces/{tid}", follow_redirects=False)  # the generic trace page sends snapshots here
    assert r.status_code == 307 and r.headers["location"] == f"/torch?id={tid}"
    assert app.get(f"/traces/{app.ggml}", follow_redirects=False).status_code == 200


def test_the_generic_diff_of_two_snapshots_is_the_torch_diff_and_a_mixed_pair_is_refused(app):
    a, b = app.ids["gpt2_train_bs8"], app.ids["oom"]
    generic = app.get(f"/api/diff?a={a}&b={b}")
    assert generic.status_code == 200, generic.text
    d = generic.json()
    torch_route = app.get(f"/api/torch/diff?a={a}&b={b}").json()
    assert d["kind"] == "torch" and d["delta_requested"] == torch_route["delta_requested"] != 0
    assert d["a"]["peak_requested"] == sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"]
    assert d["alignment"]["n_a"] > 0 and d["alignment"]["n_b"] > 0
    first = d["first_difference"]
    assert first["differs_in"] == "stack" and first["a"]["index"] == d["alignment"]["first_divergence"]
    assert first["a"]["size"] > 0 and first["a"]["site"]
    same = app.get(f"/api/diff?a={a}&b={a}:0").json()
    assert same["delta_requested"] == 0 and same["first_difference"] is None
    mixed = app.get(f"/api/diff?a={a}&b={app.ggml}")
    assert mixed.status_code == 400 and "same kind" in mixed.text and "\n" not in mixed.json()["detail"]


def test_live_after_an_entry_is_the_largest_allocations_of_the_state_there(app):
    tid = app.ids["oom"]
    base = f"/api/torch/traces/{tid}/devices/0"
    n = app.get(f"{base}/timeline?max_bands=0").json()["n_events"]
    k = n // 2
    live = app.get(f"{base}/live?at={k}&top=5").json()
    assert live["after_entry"] == k and 0 < len(live["largest"]) <= 5
    sizes = [a["bytes"] for a in live["largest"]]
    assert sizes == sorted(sizes, reverse=True)
    held = [b for g in app.get(f"{base}/state?event={k + 1}").json()["segments"] for b in g["blocks"]
            if b["state"] == "allocated"]
    by_entry = {b["alloc"]: b for b in held}
    assert all(a["entry"] <= k and a["entry"] in by_entry for a in live["largest"])
    assert app.get(f"{base}/live?at={n}").status_code == 400
    assert app.get(f"{base}/live?at=-1").status_code == 422
    e = app.get(f"{base}/entries?start={live['largest'][0]['entry']}&limit=1&frames=true").json()["entries"][0]
    assert e["action"] == "alloc" and isinstance(e["flame_path"], list) and e["flame_path"]


def test_timeline_bands_carry_their_stack_only_when_asked(app):
    base = f"/api/torch/traces/{app.ids['gpt2_train_bs8']}/devices/0"
    plain = app.get(f"{base}/timeline?max_bands=20").json()["bands"]
    assert plain and all("stack" not in b for b in plain)
    bands = app.get(f"{base}/timeline?max_bands=20&frames=3").json()["bands"]
    assert [b["alloc"] for b in bands] == [b["alloc"] for b in plain]
    assert all(len(b["stack"]) <= 3 for b in bands) and any(len(b["stack"]) == 3 for b in bands)
    for b in [b for b in bands if b["stack"]][:5]:  # frames of the entry's own stack, innermost first
        names = [f["name"] for f in app.get(f"{base}/entries?start={b['alloc']}&limit=1&frames=true").json()["entries"][0]["frames"]]
        at = [names.index(s.split(" (")[0]) for s in b["stack"]]
        assert at == sorted(at)
    assert app.get(f"{base}/timeline?frames=17").status_code == 422


def test_a_snapshot_summary_says_why_it_has_no_categories(app):
    c = app.get(f"/api/torch/traces/{app.ids['oom']}").json()["categories"]
    assert c["known"] is False and "plan --vary" in c["why"]
