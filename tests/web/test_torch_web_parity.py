"""The PyTorch snapshot page's views that follow one another, in a real headless Chromium against a real
server: one colour per allocation in every view, scrubbing through time, stacks on hover, flamegraph zoom."""
from pathlib import Path

import httpx
import pytest
from conftest import live_server, upload_snapshots


pytest.importorskip("playwright.sync_api")

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"


# a `plan --vary` search as store_vary keeps it: the run at its answer, every point with its bytes per category
VARY = {"name": "batch", "budget": 8 << 30, "value": 16, "lo": 8, "hi": 64, "laws": {}, "stored_value": 16,
        "points": [{"value": 8, "fits": True, "categories": {"parameters": 500_000_000, "activations": 90_000_000}},
                   {"value": 16, "fits": True, "peak_allocated": 1_100_000_000,
                    "categories": {"parameters": 500_000_000, "gradients": 500_000_000, "activations": 180_000_000,
                                   "temporaries": 4_000_000}}]}


def store_plan_like(store_dir):
    from alloctrace.traces.sources import read_file, store_traces
    from alloctrace.traces.store.store import open_store
    store = open_store(store_dir)
    try:
        with open(DATA / "small_default.pickle.gz", "rb") as f:
            traces = read_file(f, name="plan batch=16", filename="plan.pickle.gz", tags=("vary=batch",))
        for t in traces:
            t.meta.extra = {**t.meta.extra, "plan_vary": VARY}
        return store_traces(store, traces)[0]["id"]
    finally:
        store.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("store")
    plan = store_plan_like(store_dir)
    with live_server(store_dir) as base:
        ids = {"plan": plan}
        ids.update(upload_snapshots(base, [DATA / f"{name}.pickle.gz" for name in ("oom", "gpt2_train_bs8")]))
        yield {"base": base, **ids}


def open_page(page, server, name="gpt2_train_bs8"):
    page.goto(f"{server['base']}/torch?id={server[name]}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    page.wait_for_selector("#timeline[data-ready='1']")
    page.wait_for_selector("#flame[data-ready='1']")


def test_an_allocation_has_one_colour_in_the_timeline_the_state_and_the_flamegraph(server, page):
    open_page(page, server)
    tid = server["gpt2_train_bs8"]
    peak = httpx.get(f"{server['base']}/api/torch/traces/{tid}/devices/0/peak", timeout=60).json()["event"]
    # the largest drawn allocation live at the peak (so its stack is in the peak's flamegraph)
    band = page.evaluate(f"""() => {{ const d = document.getElementById('timeline');
        const i = d.data.findIndex(t => t.customdata && t.customdata[0] <= {peak}
            && Math.max(...t.x) > {peak});
        d.emit('plotly_click', {{points: [{{x: d.data[i].x[0], data: d.data[i]}}]}});
        return {{alloc: d.data[i].customdata[0], color: d.data[i].fillcolor,
                 others: [...new Set(d.data.filter(t => t.customdata).map(t => t.fillcolor))].length}}; }}""")
    assert band["others"] > 5  # allocations are told apart, not one colour per call site
    page.wait_for_selector("#allocation[data-color]")
    assert page.get_attribute("#allocation", "data-color") == band["color"]
    # the flamegraph outlines its stack, frame by frame, in the same colour
    entry = httpx.get(f"{server['base']}/api/torch/traces/{tid}/devices/0/entries",
                      params={"start": band["alloc"], "limit": 1, "frames": "true"}, timeout=60).json()["entries"][0]
    assert entry["flame_path"]
    page.wait_for_selector("#flame[data-marked]")
    assert page.get_attribute("#flame", "data-marked") == str(len(entry["flame_path"]))
    strokes = page.eval_on_selector_all("#flame g[data-marked] rect", "rs => rs.map(r => r.getAttribute('stroke'))")
    assert strokes and set(strokes) == {band["color"]}
    names = page.eval_on_selector_all("#flame g[data-marked]", "gs => gs.map(g => g.dataset.name)")
    assert names == entry["flame_path"]
    # the state view (after that entry) draws its block in the same colour
    page.wait_for_selector(f"#segments[data-event='{band['alloc'] + 1}']", timeout=30000)
    block = page.evaluate(f"""() => {{ const t = document.getElementById('segments').data.find(t => t.name === 'allocated');
        return t.marker.color[t.customdata.indexOf({band['alloc']})]; }}""")
    assert block == band["color"]


def test_scrubbing_moves_the_state_the_live_table_and_the_line_together(server, page):
    open_page(page, server)
    tid = server["gpt2_train_bs8"]
    page.wait_for_selector("#segments[data-event]")
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "/state?" in r.url else None)
    # a drag: many positions in a row, one state asked for where it rests
    page.evaluate("""() => { const s = document.getElementById('scrub');
        for (const v of [100, 900, 1500, 2000, 2500]) { s.value = String(v); s.dispatchEvent(new Event('input')); } }""")
    page.wait_for_selector("#segments[data-event='2501']", timeout=30000)
    page.wait_for_selector("#live-top[data-after='2500']", timeout=30000)
    assert len(asked) == 1 and "event=2501" in asked[0]
    assert page.inner_text("#state-after") == "2,500"  # "after entry N": entries 0..N applied
    assert page.input_value("#state-event") == "2500"
    # the table is the server's largest allocations live after that entry, in their colours
    live = httpx.get(f"{server['base']}/api/torch/traces/{tid}/devices/0/live", params={"at": 2500}, timeout=60).json()
    state = httpx.get(f"{server['base']}/api/torch/traces/{tid}/devices/0/state", params={"event": 2501}, timeout=60).json()
    held = {b["alloc"] for g in state["segments"] for b in g["blocks"] if b["state"] == "allocated"}
    assert live["largest"] and {a["entry"] for a in live["largest"]} <= held
    entries = page.eval_on_selector_all("#live-top a[data-entry]", "as => as.map(a => Number(a.dataset.entry))")
    assert entries == [a["entry"] for a in live["largest"]]
    line = page.evaluate("document.getElementById('timeline').layout.shapes.filter(s => s.name === 'scrub').map(s => s.x0)")
    assert line == [2500]
    # a zoom keeps the line where it is
    page.evaluate("Plotly.relayout('timeline', {'xaxis.range[0]': 2000, 'xaxis.range[1]': 3000})")
    page.wait_for_selector("#timeline[data-x0='2000'][data-x1='3000']", timeout=30000)
    line = page.evaluate("document.getElementById('timeline').layout.shapes.filter(s => s.name === 'scrub').map(s => s.x0)")
    assert line == [2500]



def test_hovering_an_allocation_on_the_timeline_shows_its_stack(server, page):
    open_page(page, server)
    tid = server["gpt2_train_bs8"]
    api = httpx.get(f"{server['base']}/api/torch/traces/{tid}/devices/0/timeline",
                    params={"max_points": 800, "max_bands": 120, "frames": 8}, timeout=60).json()
    band = max(api["bands"], key=lambda b: b["size"] * len(b["x"]))
    assert 0 < len(band["stack"]) <= 8
    # the mouse in the middle of that band's polygon, in screen pixels
    at = page.evaluate(f"""() => {{ const d = document.getElementById('timeline'), L = d._fullLayout;
        const t = d.data.find(t => t.customdata && t.customdata[0] === {band['alloc']});
        const n = t.x.length / 2, j = Math.floor(n / 2);
        const x = t.x[j], y = (t.y[j] + t.y[t.y.length - 1 - j]) / 2;
        const box = d.querySelector('.nsewdrag').getBoundingClientRect();
        return {{x: box.left + L.xaxis.l2p(x), y: box.top + L.yaxis.l2p(y)}}; }}""")
    page.mouse.move(at["x"], at["y"])
    page.wait_for_selector("#timeline .hoverlayer .hovertext", timeout=10000)
    shown = page.evaluate("document.querySelector('#timeline .hoverlayer').textContent")
    assert f"entries {band['alloc']}" in shown
    assert band["stack"][0].split(" (")[0] in shown and band["stack"][-1].split(" (")[0] in shown


def test_clicking_a_flamegraph_frame_zooms_into_it_and_the_breadcrumbs_lead_back(server, page):
    open_page(page, server)
    boxes = """() => [...document.querySelectorAll('#flame g[data-depth]')].map(g => ({name: g.dataset.name,
        depth: Number(g.dataset.depth), x: Number(g.querySelector('rect').getAttribute('x')),
        w: Number(g.querySelector('rect').getAttribute('width')), shown: g.style.display !== 'none'}))"""
    before = page.evaluate(boxes)
    full = max(b["w"] for b in before)
    # a frame two levels up that is well under the whole width and has callees above it
    pick = next(i for i, b in enumerate(before) if b["depth"] == 2 and 0.05 * full < b["w"] < 0.9 * full
                and any(c["depth"] == 3 and b["x"] <= c["x"] and c["x"] + c["w"] <= b["x"] + b["w"] + 0.01 for c in before))
    target = before[pick]
    page.locator("#flame g[data-depth]").nth(pick).locator("rect").click()
    page.wait_for_selector("#flame[data-zoom]:not([data-zoom=''])")
    after = page.evaluate(boxes)
    assert abs(after[pick]["w"] - full) < 0.1  # the frame fills the width
    inside = [i for i, c in enumerate(before) if c["depth"] > 2 and target["x"] <= c["x"]
              and c["x"] + c["w"] <= target["x"] + target["w"] + 0.01]
    assert inside and all(after[i]["shown"] for i in inside)
    for i in inside:  # its callees keep their share of it
        assert abs(after[i]["w"] / full - before[i]["w"] / target["w"]) < 0.002
    outside = [i for i, c in enumerate(before) if c["depth"] == 2 and i != pick]
    assert all(not after[i]["shown"] for i in outside)
    crumbs = page.inner_text("#flame-crumbs")
    assert crumbs.startswith("all") and crumbs.endswith(target["name"]) and crumbs.count("›") == 2
    # back to the whole graph: every box where the server drew it
    page.click("#flame-crumbs button >> text=all")
    page.wait_for_selector("#flame[data-zoom='']")
    assert page.evaluate(boxes) == before
    assert page.is_hidden("#flame-crumbs")


def test_compare_with_finds_another_snapshot_and_opens_the_diff(server, page):
    open_page(page, server)
    page.click("#compare summary")
    page.wait_for_selector("#compare-list[data-hits]")
    names = page.eval_on_selector_all("#compare-list a", "as => as.map(a => a.textContent)")
    assert sorted(names) == ["oom.pickle.gz", "plan batch=16"]  # every other snapshot, not this one
    page.fill("#compare-q", "nothing like it")
    page.wait_for_selector("#compare-list[data-hits='0']")
    assert "No other snapshot matches" in page.inner_text("#compare-list")
    page.fill("#compare-q", server["oom"][:5])  # by id as well as by name
    page.wait_for_selector("#compare-list[data-hits='1']")
    page.click("#compare-list a")
    page.wait_for_url(f"**/torch?a={server['gpt2_train_bs8']}&b={server['oom']}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    assert page.inner_text("#title") == "Diff: gpt2_train_bs8.pickle.gz (A) → oom.pickle.gz (B)"


def test_the_snapshot_page_fits_a_phone(server, window):
    page = window(390, 844).new_page()
    try:
        open_page(page, server)
        page.click("#compare summary")
        page.wait_for_selector("#compare-list[data-hits]")
        page.wait_for_selector("#live-top[data-after]", timeout=30000)
        wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e => {
            if (e.closest('.table-scroll, .js-plotly-plot, svg')) return false;
            const r = e.getBoundingClientRect(); return r.width > 0 && r.right > window.innerWidth + 1; })
            .map(e => e.tagName + '#' + e.id + '.' + e.className).slice(0, 5)""")
        assert wide == []
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        assert page.evaluate("document.getElementById('scrub').getBoundingClientRect().right") <= 390
    finally:
        page.close()


def test_the_category_view_shows_a_plans_bytes_per_category_and_says_why_a_snapshot_has_none(server, page):
    open_page(page, server, "plan")
    page.wait_for_selector("#categories[data-known='true']")
    rows = page.eval_on_selector_all("#categories tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.innerText))")
    want = VARY["points"][1]["categories"]
    assert [r[0] for r in rows] == sorted(want, key=lambda k: (-want[k], k))
    assert all(f"{want[r[0]]:,} B" in r[1] for r in rows)
    assert "batch = 16" in page.inner_text("#categories-note")
    open_page(page, server, "gpt2_train_bs8")
    page.wait_for_selector("#categories[data-known='false']")
    assert "not what a tensor is for" in page.inner_text("#categories-note")
