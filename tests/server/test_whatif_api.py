"""The what-if API route on a real store: the fixture snapshots imported through the sources seam."""
import pytest
from fastapi.testclient import TestClient

from alloctrace.server.app import create_app
from alloctrace.traces import import_paths
from alloctrace.traces.store.store import open_store

from torchsnap import DATA, sidecar

NAMES = ("oom", "fragmentation", "small_default")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """(store directory, {fixture name: trace id})."""
    d = tmp_path_factory.mktemp("store")
    store = open_store(d)
    ids = {n: import_paths(store, [DATA / f"{n}.pickle.gz"])[0] for n in NAMES}
    store.close()
    return d, ids


@pytest.fixture()
def client(stored):
    with TestClient(create_app(store_dir=stored[0])) as c:
        c.ids = stored[1]
        yield c


def _url(client, name, device=0):
    return f"/api/torch/traces/{client.ids[name]}/devices/{device}/whatif"


def test_whatif_route_real_and_whatif(client):
    r = client.get(_url(client, "oom"),
                   params=[("set", "expandable_segments=true"), ("cap", "6GiB"), ("points", "200")])
    assert r.status_code == 200, r.text
    out = r.json()
    truth = sidecar("oom")["ground_truth"]
    assert out["trace_id"] == client.ids["oom"] and out["device"] == 0
    assert out["real"]["consistent"] is True and out["real"]["peak_reserved"] == truth["max_memory_reserved"]
    assert out["real"]["oom"]["size"] == 48 << 20
    assert out["settings"]["expandable_segments"] is True and out["settings"]["memory_limit"] == 6 << 30
    s = out["series"]
    assert len(s["event"]) == len(s["real_reserved"]) == len(s["whatif_reserved"]) <= 200
    assert max(s["real_reserved"]) == truth["max_memory_reserved"]     # bucket maxima keep the peak
    assert max(s["whatif_reserved"]) == out["whatif"]["peak_reserved"]


def test_whatif_route_expandable_segments_lower_the_fragmentation_peak(client):
    out = client.get(_url(client, "fragmentation"), params={"set": "expandable_segments=true"}).json()
    assert out["real"]["consistent"] is True
    assert out["real"]["peak_reserved"] == sidecar("fragmentation")["ground_truth"]["max_memory_reserved"]
    assert out["whatif"]["peak_reserved"] < out["real"]["peak_reserved"]
    assert out["whatif"]["peak_allocated"] <= out["whatif"]["peak_reserved"]


@pytest.mark.parametrize("params,status", [
    ([("set", "nope=1")], 400), ([("cap", "lots")], 400), ([("points", "5")], 422), ([("set", "expandable")], 400),
])
def test_whatif_route_bad_input(client, params, status):
    r = client.get(_url(client, "small_default"), params=params)
    assert r.status_code == status and "detail" in r.json()


def test_whatif_route_unknown_trace_and_bad_id(client):
    assert client.get("/api/torch/traces/0000000f/devices/0/whatif").status_code == 404
    assert client.get("/api/torch/traces/xyz/devices/0/whatif").status_code == 422
    r = client.get(_url(client, "small_default", 3))                       # one device only
    assert r.status_code == 404 and "detail" in r.json()
