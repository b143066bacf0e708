"""The PyTorch snapshot page in a real headless Chromium against a real server: the timeline, the state view at
the OOM, and the diff of the batch-8/16 pair. Screenshots go to test-artifacts/ (gitignored)."""
import json
from pathlib import Path

import httpx
import pytest
from conftest import live_server, upload_snapshots


pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
ARTIFACTS = ROOT / "test-artifacts"


def sidecar(name):
    return json.loads((DATA / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("store")
    with live_server(store_dir) as base:
        ids = upload_snapshots(base, [DATA / f"{name}.pickle.gz"
                                      for name in ("oom", "gpt2_train_bs8", "gpt2_train_bs16", "fragmentation")])
        yield {"base": base, **ids}




def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"torch-{name}.png"), full_page=True)


def test_timeline_draws_bands_and_zooms_with_a_new_level_of_detail(server, page):
    page.goto(f"{server['base']}/torch?id={server['gpt2_train_bs8']}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    page.wait_for_selector("#timeline[data-ready='1']")
    n = sidecar("gpt2_train_bs8")["snapshot_analysis"]["trace_entries_per_device"][0]
    assert page.get_attribute("#timeline", "data-x1") == str(n)
    bands = int(page.get_attribute("#timeline", "data-bands"))
    assert 0 < bands <= 120
    # the drawn total reaches the recorded peak of requested bytes
    top = page.evaluate("Math.max(...document.getElementById('timeline').data[0].y)")
    assert top == sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"]
    # annotations appear as bands with their names
    names = page.evaluate("document.getElementById('timeline').layout.annotations.map(a => a.text)")
    assert {"forward", "backward"} <= set(names)
    shot(page, "timeline")
    # zooming asks the server for that window only
    page.evaluate("Plotly.relayout('timeline', {'xaxis.range[0]': 1000, 'xaxis.range[1]': 2000})")
    page.wait_for_selector("#timeline[data-x0='1000'][data-x1='2000']", timeout=30000)
    grid = page.evaluate("document.getElementById('timeline').data[0].x")
    assert grid[0] == 1000 and grid[-1] < 2000
    # the peak table adds up to the peak
    rows = page.locator("#peak-table tbody tr")
    assert rows.count() >= 3


def test_state_view_at_the_oom(server, page):
    page.goto(f"{server['base']}/torch?id={server['oom']}&view=oom")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    card = page.locator("#oom")
    truth = sidecar("oom")
    assert "Out of memory" in card.inner_text()
    assert card.locator("text=48.00 MiB").count() >= 1  # "Tried to allocate 48.00 MiB"
    n = truth["snapshot_analysis"]["trace_entries_per_device"][0]
    oom_at = n - 1  # the OOM is the last entry of this trace
    page.wait_for_selector(f"#segments[data-event='{oom_at}']", timeout=30000)
    assert page.get_attribute("#segments", "data-segments") == str(truth["snapshot_analysis"]["n_segments"])
    totals = page.inner_text("#state-totals")
    assert "408.08 MiB" in totals  # reserved − allocated, as torch's message says it
    shot(page, "state-oom")
    page.click("#state-end")  # the snapshot: one entry later than the OOM
    page.wait_for_function(f"document.getElementById('segments').dataset.event !== '{oom_at}'")


def test_diff_of_batch_8_and_16(server, page):
    page.goto(f"{server['base']}/torch?a={server['gpt2_train_bs8']}&b={server['gpt2_train_bs16']}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    page.wait_for_selector("#sequence[data-ready='1']")
    delta = (sidecar("gpt2_train_bs16")["memory_stats_subset"]["requested_bytes.all.peak"]
             - sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"])
    titles = page.eval_on_selector_all("#diff-sites tbody tr td:nth-child(3) span[title]",
                                       "els => els.map(e => e.title)")
    assert sum(int(t.split()[0].replace(",", "")) for t in titles) == delta
    assert "the same call-site sequence" in page.inner_text("#align-note")
    assert "3,651 allocations paired" in page.inner_text("#align-note")
    shot(page, "diff")


def test_home_lists_snapshots_and_links_a_diff(server, page):
    page.goto(f"{server['base']}/torch")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    assert page.locator("#list tbody tr").count() == 4
    page.click("#diff-form button")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    assert "a=" in page.url and "b=" in page.url


def exact_cells(page, row):
    """The exact byte counts of a what-if table row: (real, what-if)."""
    import re
    cells = page.locator(f"#whatif-result tr[data-row='{row}'] td").all_inner_texts()
    return tuple(int(re.search(r"([\d,]+) B", c).group(1).replace(",", "")) for c in cells)


def test_whatif_panel_shows_the_apis_peaks(server, page):
    """The torch page's "What if…" panel, expandable segments preset, on the fragmentation run: the numbers shown
    are the API's, the replay of the recorded run is consistent and its peak is the recorded one."""
    frag = server["fragmentation"]
    page.goto(f"{server['base']}/torch?id={frag}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    assert "caching-allocator replay\nconsistent" in page.inner_text("#facts").lower()
    page.click("#whatif-details summary")
    page.click("#whatif [data-preset='expandable']")
    page.wait_for_selector("#whatif-result[data-ready='1']", timeout=30000)
    api = httpx.get(f"{server['base']}/api/torch/traces/{frag}/devices/0/whatif",
                    params={"set": "expandable_segments=true", "points": 600}, timeout=60).json()
    assert exact_cells(page, "peak_reserved") == (api["real"]["peak_reserved"], api["whatif"]["peak_reserved"])
    assert exact_cells(page, "peak_allocated") == (api["real"]["peak_allocated"], api["whatif"]["peak_allocated"])
    assert api["real"]["peak_reserved"] == sidecar("fragmentation")["ground_truth"]["max_memory_reserved"]
    assert api["whatif"]["peak_reserved"] < api["real"]["peak_reserved"]
    assert "consistently" in page.inner_text("#wi-consistent")
    assert page.eval_on_selector("#wi-expandable_segments", "e => e.value") == "true"   # the preset filled it
    top = page.evaluate("Math.max(...document.getElementById('wi-plot-whatif').data[0].y)")
    assert top == api["whatif"]["peak_reserved"]                 # bucket maxima keep the peak
    shot(page, "whatif")


def test_whatif_page_marks_where_a_capped_run_fails(server, page):
    """/whatif on its own (a link from the panel): under a cap below the program's need the run stops, and the
    plot marks the OOM where the API says."""
    frag = server["fragmentation"]
    page.goto(f"{server['base']}/whatif?trace={frag}&device=0&cap=4GiB")
    page.wait_for_selector("#whatif-result[data-ready='1']", timeout=30000)
    api = httpx.get(f"{server['base']}/api/torch/traces/{frag}/devices/0/whatif",
                    params={"cap": "4GiB", "points": 600}, timeout=60).json()
    stop = api["whatif"]["stopped_at"]
    assert stop is not None and f"fails at entry {stop:,}" in page.inner_text("#whatif-result")
    marks = page.evaluate("document.getElementById('wi-plot-whatif').data.filter(t => t.name === 'OOM')"
                          ".map(t => t.x[0])")
    assert marks == [api["whatif"]["oom"]["event"]]
    assert "/static/" in page.evaluate("[...document.scripts].map(s => s.src).join(' ')")


HOSTILE = "<img src=x onerror=alert(1)>"


def test_upload_through_the_page_and_hostile_names_stay_text(server, page, tmp_path):
    """A snapshot whose frames, metadata and annotations are HTML: uploaded through the page, shown as text."""
    import pickle
    f = [{"name": HOSTILE, "filename": HOSTILE + ".py", "line": 1}]
    mib = 1 << 20
    entries = [{"action": "segment_alloc", "addr": 1 << 30, "size": 20 * mib, "stream": 0, "time_us": 1, "frames": f,
                "user_metadata": HOSTILE},
               {"action": "alloc", "addr": 1 << 30, "size": 12 * mib, "stream": 0, "time_us": 2, "frames": f,
                "user_metadata": HOSTILE},
               {"action": "oom", "size": 64 * mib, "device_free": 0, "stream": 0, "time_us": 3, "frames": f,
                "user_metadata": HOSTILE}]
    seg = {"device": 0, "address": 1 << 30, "total_size": 20 * mib, "allocated_size": 12 * mib,
           "active_size": 12 * mib, "requested_size": 12 * mib, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": f,
           "blocks": [{"address": 1 << 30, "size": 12 * mib, "requested_size": 12 * mib, "state": "active_allocated",
                       "frames": f},
                      {"address": (1 << 30) + 12 * mib, "size": 8 * mib, "requested_size": 0, "state": "inactive",
                       "frames": []}]}
    snap = {"segments": [seg], "device_traces": [entries], "allocator_settings": {},
            "external_annotations": [{"stage": "START", "name": HOSTILE, "device": 0, "time_us": 1},
                                     {"stage": "END", "name": HOSTILE, "device": 0, "time_us": 3}]}
    p = tmp_path / f"{HOSTILE}.pickle"
    p.write_bytes(pickle.dumps(snap))
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{server['base']}/torch")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    page.set_input_files("#upload-file", str(p))
    page.click("#upload-form button")
    page.wait_for_url("**/torch?id=*", timeout=30000)
    page.wait_for_selector("#timeline[data-ready='1']", timeout=30000)
    page.wait_for_selector("#oom")
    assert HOSTILE in page.inner_text("#oom") and HOSTILE in page.inner_text("#peak-table")
    assert "rebuilt state = snapshot\nyes" in page.inner_text("#facts").lower()
    page.hover("#timeline .nsewdrag", position={"x": 300, "y": 200})
    assert page.locator("img[src='x']").count() == 0 and dialogs == []
    shot(page, "hostile")


def test_clicking_a_band_shows_its_stack(server, page):
    page.goto(f"{server['base']}/torch?id={server['oom']}")
    page.wait_for_selector("#timeline[data-ready='1']", timeout=30000)
    alloc = page.evaluate("""() => { const d = document.getElementById('timeline');
        const i = d.data.findIndex(t => t.customdata);
        d.emit('plotly_click', {points: [{x: d.data[i].x[0], data: d.data[i]}]});
        return d.data[i].customdata[0]; }""")
    page.wait_for_selector("#allocation h2")
    assert f"entry {alloc:,}" in page.inner_text("#allocation h2")
    assert page.locator("#allocation li").count() >= 1  # the stack, innermost first
    page.wait_for_selector(f"#segments[data-event='{alloc + 1}']", timeout=30000)


def test_the_timeline_is_drawn_before_plotly_and_the_chart_takes_its_place(server, page):
    """The first picture is the timeline's real data on a canvas while Plotly.js is held back; the
    interactive chart then replaces it."""
    tid = server["gpt2_train_bs8"]
    api = httpx.get(f"{server['base']}/api/torch/traces/{tid}/devices/0/timeline?max_points=800&max_bands=120",
                    timeout=60).json()
    held = []
    page.route("**/plotly.min.js", lambda route: held.append(route))
    page.goto(f"{server['base']}/torch?id={tid}")
    page.wait_for_selector("#timeline[data-overview='1'] canvas.figure-sketch", timeout=30000)
    assert page.evaluate("typeof window.Plotly") == "undefined"
    assert page.get_attribute("#timeline canvas", "data-shapes") == str(len(api["bands"]))  # one polygon a band
    while not held:
        page.wait_for_timeout(20)
    for r in held:
        r.continue_()
    page.unroute("**/plotly.min.js")
    page.wait_for_selector("#timeline[data-ready='1']", timeout=30000)
    assert page.locator("#timeline canvas.figure-sketch").count() == 0
    assert page.get_attribute("#timeline", "data-bands") == str(len(api["bands"]))
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)  # the state view drew with Plotly too


def test_the_diff_page_shows_two_snapshots_peak_delta_and_first_difference(server, page):
    a, b = server["gpt2_train_bs8"], server["gpt2_train_bs16"]
    page.goto(f"{server['base']}/diff?a={a}:0&b={b}:0")  # the diff page's links name a graph: a device here
    delta = page.locator("#torch-diff-peak-delta")
    try:
        delta.wait_for(timeout=30000)
    except Exception:
        raise AssertionError((page.errors, page.inner_text("body")[:800]))
    d = httpx.get(f"{server['base']}/api/diff?a={a}&b={b}", timeout=60).json()
    want = (sidecar("gpt2_train_bs16")["memory_stats_subset"]["requested_bytes.all.peak"]
            - sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"])
    assert d["delta_requested"] == want > 0
    assert delta.get_attribute("title") == f"{want:,} B" and delta.inner_text().startswith("+")
    assert "same call-site sequence" in page.locator("#torch-diff-aligned").inner_text()
    first = page.locator("#torch-diff-first").inner_text()
    assert first.startswith("First allocation that differs (size)") and f"#{d['first_difference']['a']['index']:,}" in first
    assert page.locator("#torch-diff-sites tbody tr").count() == len(d["by_call_site"]) > 1
    assert page.locator("#maps").is_hidden() and "No divergence" not in page.inner_text("body")
    shot(page, "diff")
    assert page.errors == []


def test_state_and_peak_name_the_same_entry(server, page):
    """The peak panel's "at entry N" and the state panel after "at the peak" show the same N; typing N into
    the state box shows the same state (entries 0..N applied, as the flamegraph counts them)."""
    page.goto(f"{server['base']}/torch?id={server['gpt2_train_bs8']}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    page.wait_for_function("document.getElementById('peak-note').textContent.includes('at entry')")
    import re
    k = re.search(r"at entry ([\d,]+)", page.inner_text("#peak-note")).group(1)
    page.click("#state-peak")
    page.wait_for_function(f"(document.getElementById('state-after') || {{}}).textContent === '{k}'")
    assert page.input_value("#state-event") == k.replace(",", "")
    shown = page.inner_text("#state-totals")
    page.click("#state-end")
    page.wait_for_function(f"document.getElementById('state-after').textContent !== '{k}'")
    page.fill("#state-event", k.replace(",", ""))
    page.click("#state-go")
    page.wait_for_function(f"document.getElementById('state-after').textContent === '{k}'")
    assert page.inner_text("#state-totals") == shown
