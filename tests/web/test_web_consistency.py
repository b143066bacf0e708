"""A graph's consistency in the dashboard, in a real headless Chromium: beside its sizes on the trace page and
in the home list, and an inconsistent graph's mismatches with its map drawn from the recorded placements.

The inconsistent trace is a real recording (tests/data/record/moe/) replayed by a model without CLAMP on its
in-place list, as alloctrace did before ggml 0.25.3 was modelled: the real ggml reused the parent of each
layer's clamped MoE weight sum.
"""
import io
import lzma
from pathlib import Path

import httpx
import pytest

import alloctrace.traces.sources.record.plans as replay
from alloctrace.traces.sources.record.source import RecordingSource
from alloctrace.traces.store.store import open_store
from conftest import live_server

pytest.importorskip("playwright.sync_api")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MOE = Path(__file__).parents[1].joinpath("data") / "record" / "moe" / "qwen3moe-fa-on-c512.atrec.xz"


def stored(store, monkeypatch, name, generation=None):
    data = lzma.decompress(MOE.read_bytes())
    with monkeypatch.context() as m:
        if generation:
            m.setattr(replay, "profile_for_version", lambda version: generation)
        (trace,) = RecordingSource().read(io.BytesIO(data), filename="moe.atrec", name=name)
        return store.add_trace(trace.meta, trace.graphs)


@pytest.fixture
def moe_server(tmp_path, monkeypatch):
    store = open_store(tmp_path / "store")
    ids = {"bad": stored(store, monkeypatch, "moe before CLAMP in place", "ggml-2026-08-21"),
           "good": stored(store, monkeypatch, "moe as ggml 0.25.3")}
    store.close()
    with live_server(tmp_path / "store") as base:
        yield base, ids


def test_an_inconsistent_graph_lists_its_mismatches_and_still_draws_its_map(moe_server, page):
    base, ids = moe_server
    summary = httpx.get(f"{base}/api/traces/{ids['bad']}", timeout=30).json()
    bad = next(g for g in summary["graphs"] if g["role"] == "eval" and g["consistent"] is False)
    want = httpx.get(f"{base}/api/traces/{ids['bad']}/graphs/{bad['index']}/consistency", timeout=30).json()
    assert want["offsets"] and want["consistent"] is False

    page.goto(f"{base}/traces/{ids['bad']}?g={bad['index']}")
    page.wait_for_selector("#mismatch-table tbody tr")
    assert page.inner_text("#consistent") == "no"
    rows = page.eval_on_selector_all("#mismatch-table tbody tr",
                                     "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    first = want["offsets"][0]
    assert rows[0][:5] == [first["tensor"], f"{first['model_offset']:,}", f"{first['real_offset']:,}", "0 (CPU)", "0"]
    assert any("ffn_moe_weights_sum_clamped" in r[0] for r in rows)
    assert len(rows) == len(want["offsets"])
    # the map: the recorded placements (an alloc_graph that reused its plan walks nothing of its own)
    page.wait_for_selector("#map[data-ready='1']", timeout=30000)
    n = page.evaluate("""() => document.getElementById('map').data
        .filter(t => t.fill === 'toself').reduce((n, t) => n + t.x.filter(v => v === null).length, 0)""")
    assert n > 50
    assert "no op" not in page.inner_text("#map-note")
    assert "recorded placements" in page.inner_text("#mismatches")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-inconsistent-graph.png"), full_page=True)
    # the reserve whose plan the eval used answers for the same placements
    plan = max((g for g in summary["graphs"] if g["role"] == "reserve" and g["index"] < bad["index"]),
               key=lambda g: g["index"])
    page.goto(f"{base}/traces/{ids['bad']}?g={plan['index']}")
    page.wait_for_selector("#mismatch-table tbody tr")
    assert page.inner_text("#consistent") == "no"
    assert page.inner_text("#mismatch-table tbody tr:first-child td:last-child") == str(bad["index"])


def test_a_consistent_graph_says_so_and_the_home_list_shows_both(moe_server, page):
    base, ids = moe_server
    page.goto(f"{base}/traces/{ids['good']}?g=3")
    page.wait_for_selector("#consistent .badge")
    assert page.inner_text("#consistent") == "yes"
    assert page.is_hidden("#mismatches")
    page.goto(base + "/")
    page.wait_for_selector("#trace-table")
    good = page.inner_text(f"#trace-table tr[data-id='{ids['good']}'] td.consistency")
    bad = page.inner_text(f"#trace-table tr[data-id='{ids['bad']}'] td.consistency")
    assert good == "yes"
    assert bad.startswith("no: ") and "graph" in bad
    link = page.locator(f"#trace-table tr[data-id='{ids['bad']}'] a.inconsistent-graph").first
    link.click()
    page.wait_for_selector("#mismatch-table tbody tr")


def test_the_consistency_answer_and_its_refusals(moe_server):
    base, ids = moe_server
    good = httpx.get(f"{base}/api/traces/{ids['good']}/graphs/2/consistency", timeout=30).json()
    assert good["consistent"] is True and good["offsets"] == [] and good["plan_checked"] > 0
    assert good["buffer_types"] == ["CPU"] and good["map_from"] == "model"
    ev = httpx.get(f"{base}/api/traces/{ids['good']}/graphs/3/consistency", timeout=30).json()
    assert ev["map_from"] == "recorded placements" and ev["placements"] > 0
    missing = httpx.get(f"{base}/api/traces/{ids['good']}/graphs/99/consistency", timeout=30)
    assert missing.status_code == 404 and "no graph 99" in missing.json()["detail"]
    assert httpx.get(f"{base}/api/traces/nothex!/graphs/0/consistency", timeout=30).status_code in (404, 422)


def test_recorded_placements_choose_no_block(moe_server):
    """An alloc event made from a recorded placement has no block (-1 would read as ggml's "no block fitted")."""
    base, ids = moe_server
    page = httpx.get(f"{base}/api/traces/{ids['good']}/graphs/3/events?kind=alloc&limit=5", timeout=30).json()
    rows = page["events"]
    assert rows and all(r["reason"] == "recorded" and "block" not in r for r in rows)
    plan = httpx.get(f"{base}/api/traces/{ids['good']}/graphs/2/events?kind=alloc&limit=5", timeout=30).json()
    assert all("block" in r for r in plan["events"])  # the model's own walk chose one


def test_the_state_before_every_recorded_placement_holds_no_overlap(moe_server):
    base, ids = moe_server
    n = next(g for g in httpx.get(f"{base}/api/traces/{ids['good']}", timeout=30).json()["graphs"]
             if g["index"] == 3)["n_events"]
    for i in range(0, n + 1, 11):
        r = httpx.get(f"{base}/api/traces/{ids['good']}/graphs/3/state?event={i}", timeout=30)
        assert r.status_code == 200, r.text
        live = sorted((t["offset"], t["offset"] + t["size"]) for t in r.json()["live"])
        assert all(a[1] <= b[0] for a, b in zip(live, live[1:])), (i, live)


def test_a_size_the_log_cannot_pin_down_says_how_far_on_its_badge(tmp_path, page):
    """A 2023-10 scheduler log lacks its measure buffer's heap base: consistent, exact up to 48 bytes."""
    from alloctrace.traces.sources import import_paths

    log = Path(__file__).parents[1].joinpath("data") / "ggml-real" / "v2023-10-30-tallocr" / "gpt-2-backend2_tiny_short.AT.log"
    store = open_store(tmp_path / "store")
    [tid] = import_paths(store, [log])
    store.close()
    with live_server(tmp_path / "store") as base:
        g0 = httpx.get(f"{base}/api/traces/{tid}", timeout=30).json()["graphs"][0]
        assert g0["uncertainty_bytes"] == 48 and "heap base" in g0["reason"]
        page.goto(f"{base}/traces/{tid}?g=0")
        page.wait_for_selector("#consistent .badge")
        assert page.inner_text("#consistent") == "yes, exact up to 48 B"
        assert "the log lacks the buffer's heap base" in page.get_attribute("#consistent .badge", "title")
        page.goto(base + "/")
        page.wait_for_selector("#trace-table")
        assert page.inner_text(f"#trace-table tr[data-id='{tid}'] td.consistency") == "yes, exact up to 48 B"
