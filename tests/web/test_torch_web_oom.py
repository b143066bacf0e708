"""The PyTorch page's OOM items in headless Chromium against a real server: the OOM card names the cap, the
retries and the largest blocks with exact bytes, the timeline marks the OOM entry, the header's byte counts are
exact on hover, and the timeline's annotation labels never print over each other."""
import json
from pathlib import Path

import httpx
import pytest
from conftest import live_server, upload_snapshots

pytest.importorskip("playwright.sync_api")

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"


def sidecar(name):
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with live_server(tmp_path_factory.mktemp("store")) as base:
        ids = upload_snapshots(base, [DATA / f"{name}.pickle.gz"
                                      for name in ("oom", "gpt2_train_bs8")])
        yield {"base": base, **ids}


def _open(page, url):
    page.goto(url)
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    page.wait_for_selector("#timeline[data-ready='1']", timeout=30000)


def test_oom_card_names_the_cap_retries_and_largest_blocks(server, page):
    _open(page, f"{server['base']}/torch?id={server['oom']}&view=oom")
    page.wait_for_selector("#oom-cause")
    limit = sidecar("oom")["scenario_details"]["limit_bytes"]           # 6 GiB, as the real run set it
    cause = page.inner_text("#oom-cause")
    assert "memory cap" in cause and "set_per_process_memory_fraction" in cause
    lo, hi = (int(x.replace(",", "")) for x in page.inner_text("#oom-cap").split(" B")[0].split(" – "))
    assert lo <= limit <= hi
    assert f"{limit:,} B" in page.inner_text("#oom-cap")                    # the roundest value in the range
    assert page.inner_text("#oom-retries") == str(sidecar("oom")["memory_stats_full"]["num_alloc_retries"])
    rows = page.locator("#oom-largest tbody tr")
    assert rows.count() == 10
    assert "154,389,504 B" in rows.first.inner_text()                      # exact bytes in the card
    assert "50,331,648 B" in page.inner_text("#oom .facts")                # the request, exactly


def test_timeline_marks_the_oom_entry(server, page):
    _open(page, f"{server['base']}/torch?id={server['oom']}")
    k = sidecar("oom")["snapshot_analysis"]["trace_entries_per_device"][0] - 1
    assert page.get_attribute("#timeline", "data-oom-marks") == "1"
    lines = page.evaluate("document.getElementById('timeline').layout.shapes.filter(s => s.name === 'oom-line')"
                          ".map(s => s.x0)")
    assert lines == [k]  # the other line is the slider's entry (here the snapshot's, drawn dashed)
    assert page.evaluate("document.getElementById('timeline').layout.shapes.filter(s => s.type === 'line')"
                         ".map(s => s.name).sort()") == ["oom-line", "scrub"]
    assert page.locator("#timeline .annotation-text-g", has_text="OOM").count() == 1


def test_header_bytes_are_exact_on_hover(server, page):
    _open(page, f"{server['base']}/torch?id={server['oom']}")
    peak = page.locator("#facts div", has_text="peak reserved").locator(".bytes")
    assert peak.get_attribute("title") == f"{sidecar('oom')['ground_truth']['max_memory_reserved']:,} B"


def _overlaps(page):
    boxes = page.evaluate("""[...document.querySelectorAll('#timeline .annotation-text-g')].map(g => {
        const r = g.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom]; })
        .filter(b => b[1] > b[0])""")
    bad = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
           if a[0] < b[1] - 0.5 and b[0] < a[1] - 0.5 and a[2] < b[3] - 0.5 and b[2] < a[3] - 0.5]
    return boxes, bad


@pytest.mark.parametrize("width", [1440, 700])
def test_annotation_labels_never_overlap(server, page, width):
    page.set_viewport_size({"width": width, "height": 900})
    _open(page, f"{server['base']}/torch?id={server['gpt2_train_bs8']}")
    boxes, bad = _overlaps(page)
    assert boxes and not bad, bad[:3]
    # zoomed in, more labels fit and still none overlap
    page.evaluate("Plotly.relayout('timeline', {'xaxis.range[0]': 0, 'xaxis.range[1]': 3000})")
    page.wait_for_selector("#timeline[data-x0='0'][data-x1='3000']", timeout=30000)
    page.wait_for_timeout(300)
    zoomed, bad = _overlaps(page)
    assert zoomed and not bad, bad[:3]


def test_an_unrecoverable_start_shows_unknown_not_zeros(tmp_path, page):
    """A wrapped trace (expandable segments, pages unmapped under a cap) whose start cannot be recovered: the state
    panel and the OOM card say unknown where a replay from nothing would show reserved 0."""
    import gzip
    import pickle
    snap = pickle.load(gzip.open(DATA / "small_cap_expandable.pickle.gz"))
    cut = dict(snap, device_traces=[snap["device_traces"][0][len(snap["device_traces"][0]) // 3:]])
    path = tmp_path / "wrapped.pickle"
    path.write_bytes(pickle.dumps(cut, protocol=4))
    with live_server(tmp_path / "store") as base:
        with open(path, "rb") as f:
            r = httpx.post(f"{base}/api/torch/traces", files={"file": ("wrapped.pickle", f)}, timeout=60)
        assert r.status_code == 201, r.text
        tid = r.json()["traces"][0]["id"]
        _open(page, f"{base}/torch?id={tid}&view=oom")
        page.wait_for_selector("#state-unknown")
        totals = page.inner_text("#state-totals").lower()
        assert "unknown" in totals and "held by allocations the trace made" in totals
        assert "reserved\n0" not in totals and "Unknown:" in page.inner_text("#state-note")
        page.wait_for_selector("#oom-unknown")
        assert "largest free block" not in page.inner_text("#oom .facts")
