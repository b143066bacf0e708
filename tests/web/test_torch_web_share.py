"""The torch page's flamegraph and ranks panels in a real headless Chromium against a real server, on real
snapshots (three single-GPU snapshots standing in for the ranks of one job)."""
import shutil

import httpx
import pytest
from conftest import live_server

from alloctrace.traces.store.store import open_store
from alloctrace.traces.sources.ranks import import_ranks
from torchsnap import DATA, sidecar

pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("store")
    job = tmp_path_factory.mktemp("job")
    for rank, name in enumerate(("gpt2_train_bs8", "oom", "gpt2_train_bs16")):
        shutil.copy(DATA / f"{name}.pickle.gz", job / f"rank{rank}.pickle.gz")
    [ranks] = import_ranks(open_store(str(store_dir)), [job], name="job")
    with live_server(store_dir) as base:
        yield {"base": base, "ranks": ranks["id"]}


def test_flamegraph_at_the_peak_and_at_the_oom(server, page):
    page.goto(f"{server['base']}/torch?id={server['ranks']}&device=1")
    try:
        page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    except Exception:  # a first load that never finished was seen once in a long run of the whole suite: load again
        page.reload()
        page.wait_for_selector("body[data-loaded='1']", timeout=60000)
    page.wait_for_selector("#flame[data-ready='1']")
    peak = sidecar("oom")["memory_stats_subset"]["requested_bytes.all.peak"]
    assert int(page.get_attribute("#flame", "data-bytes")) == peak
    assert page.locator("#flame svg g").count() > 10
    assert page.locator("#flame svg title").first.text_content().startswith("all: ")
    before = page.get_attribute("#flame", "data-event")
    page.click("#flame-oom")
    page.wait_for_function(f"document.getElementById('flame').dataset.event !== '{before}'", timeout=30000)
    oom_entry = httpx.get(f"{server['base']}/api/torch/traces/{server['ranks']}").json()["devices"][1]["oom_events"][0]
    assert page.get_attribute("#flame", "data-event") == str(oom_entry)


def test_ranks_panel_compares_the_ranks(server, page):
    page.goto(f"{server['base']}/torch?id={server['ranks']}")
    page.wait_for_selector("body[data-loaded='1']", timeout=60000)
    page.wait_for_selector("#ranks-chart[data-ready='1']", timeout=60000)
    rows = page.locator("#ranks-table tbody tr")
    assert rows.count() == 3
    assert "out of memory: rank 1" in page.text_content("#ranks-note")
    reserved = sidecar("gpt2_train_bs16")["ground_truth"]["max_memory_reserved"]
    assert page.evaluate("Math.max(...document.getElementById('ranks-chart').data[5].y)") == reserved
    assert page.locator("#ranks-diff tbody tr").count() >= 1


def test_flame_and_ranks_api_bounds(server):
    base, tid = server["base"], server["ranks"]
    r = httpx.get(f"{base}/api/torch/traces/{tid}/devices/0/flame", params={"at": "nope"})
    assert r.status_code == 422
    r = httpx.get(f"{base}/api/torch/traces/{tid}/devices/0/flame", params={"at": "oom"})
    assert r.status_code == 400 and "has no OOM" in r.text
    r = httpx.get(f"{base}/api/torch/traces/{tid}/devices/9/flame")
    assert r.status_code == 404
    r = httpx.get(f"{base}/api/torch/traces/{tid}/ranks", params={"max_points": 50})
    assert r.status_code == 200 and all(len(x["series"]["grid"]) <= 50 for x in r.json()["ranks"])
