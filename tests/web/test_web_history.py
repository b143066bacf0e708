"""The history page and its API: buffer size per commit for a set of tags, one line per config and
buffer, paged over the commits; a jump opens the compare of its two commits with the attribution.
Real recordings of llama.cpp (tests/data/compare) and real logs (tests/data/explain)."""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from alloctrace.cli import main
from conftest import live_server

DATA = Path(__file__).resolve().parents[1] / "data"
REC = DATA / "compare"
RUNS = [  # (file, commit, config): config a is the llama.cpp recording, b a log of the allocator
    (REC / "tiny-llama-fa-on.atrec.gz", "c1", "a"), (REC / "tiny-llama-fa-off.atrec.gz", "c2", "a"),
    (REC / "tiny-llama-fa-on.again.atrec.gz", "c3", "a"),
    (DATA / "explain" / "llama-tiny_c512_ub8.head.AT.log.gz", "c1", "b"),
    (DATA / "explain" / "llama-tiny_c512_ub64.head.AT.log.gz", "c2", "b"),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("history") / "s")
    for k, (path, commit, config) in enumerate(reversed(RUNS)):  # stored out of order: the order= tag sorts
        assert main(["import", str(path), "--store", store, "--tag", f"commit={commit}", "--tag", f"config={config}",
                     "--tag", "model=tiny", "--tag", f"order={commit[1:]}"]) == 0
    with live_server(store) as url:
        yield url


def get(base, path, **params):
    r = httpx.get(base + path, params=params, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_history_series_per_config_and_buffer(base):
    h = get(base, "/api/history", tag="model=tiny")
    assert [c["value"] for c in h["commits"]] == ["c1", "c2", "c3"] and h["total"] == 3
    lines = {(s["label"], s["buffer"]): [(p["commit"], p["size"]) for p in s["points"]] for s in h["series"]}
    assert lines == {("config=a", "CPU"): [("c1", 837376), ("c2", 984320), ("c3", 837376)],
                     ("config=b", "compute"): [("c1", 196768), ("c2", 1574144)]}
    assert [(j["label"], j["base"], j["head"], j["delta"]) for j in h["jumps"]] == [
        ("config=b", "c1", "c2", 1377376), ("config=a", "c1", "c2", 146944), ("config=a", "c2", "c3", -146944)]


def test_history_pages_over_commits(base):
    first = get(base, "/api/history", tag="model=tiny", limit=2)
    rest = get(base, "/api/history", tag="model=tiny", limit=2, offset=2)
    assert [c["value"] for c in first["commits"]] == ["c1", "c2"] and [c["value"] for c in rest["commits"]] == ["c3"]
    assert first["total"] == rest["total"] == 3
    assert get(base, "/api/history", tag=["model=tiny", "config=b"])["series"][0]["buffer"] == "compute"
    r = httpx.get(base + "/api/history", params={"limit": 0}, timeout=30)
    assert r.status_code == 422
    r = httpx.get(base + "/api/history", params={"tag": "nokey"}, timeout=30)
    assert r.status_code == 400 and "bad tag" in r.json()["detail"]


def test_the_page_draws_the_lines_and_a_jump_opens_the_compare(base, page):
    page.goto(f"{base}/history?tag=model=tiny")
    page.wait_for_selector("#result[data-ready='1']", timeout=30000)
    lines = page.evaluate("() => document.getElementById('history-chart').data.map(t => [t.name, t.x, t.y])")
    assert ["config=a · CPU", ["c1", "c2", "c3"], [837376, 984320, 837376]] in lines
    assert len(lines) == 2
    jumps = page.locator("#jumps a.jump")
    assert jumps.count() == 3
    link = page.locator("#jumps li", has_text="config=a · CPU").first
    assert "817.75 KiB → 961.25 KiB (+143.50 KiB)" in link.inner_text()
    link.locator("a").click()
    page.wait_for_selector("#compare[data-ready='1']", timeout=30000)
    row = page.locator("#compare-table tbody tr", has_text="config=a")
    assert "kq" in row.inner_text() and "+143.50 KiB" in row.inner_text()
    assert page.locator("#attribution table").first.locator("tbody tr").first.inner_text().startswith("kq")
    assert "base=c1" in page.url and "head=c2" in page.url
    page.goto(page.url)  # the link reopens the same compare
    page.wait_for_selector("#compare[data-ready='1']", timeout=30000)
    assert "a buffer grew" in page.inner_text("#compare-title")
