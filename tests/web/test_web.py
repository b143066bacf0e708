"""The dashboard in a real headless Chromium against a real uvicorn server and store.

Screenshots of every page are kept in test-artifacts/ (gitignored) for people to look at.
"""
import json
from pathlib import Path

import httpx
import pytest

from alloctrace.allocator.events import Event
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store
from conftest import live_server

pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
HOSTILE = "<img src=x onerror=alert(1)>"


def hostile_trace() -> tuple[TraceMeta, list[GraphRecord]]:
    """A tiny graph whose tensor and trace carry a name that is also HTML."""
    events = [Event("graph"),
              Event("alloc", tensor=HOSTILE, op="ADD", size=4096, offset=0, block=0, n_free=1, largest_free=4096,
                    total_free=4096),
              Event("alloc", tensor="plain", op="MUL", size=2048, offset=4096, block=0, n_free=1, largest_free=2048,
                    total_free=2048),
              Event("free", tensor=HOSTILE, op="ADD", size=4096, offset=0, n_free=2, largest_free=4096,
                    total_free=6144)]
    meta = TraceMeta(name=HOSTILE, source="test", generation="ggml-2023-08-16", profile="ggml-2023-08-16")
    return meta, [GraphRecord(0, "eval", events, max_size=8192, buffer_size=8192)]


RUNNING_MAX = 1_654_784  # graph 0's high water, which a 2023 allocator keeps reporting as max_size


def running_max_trace() -> tuple[TraceMeta, list[GraphRecord]]:
    """Graph 1 peaks at 206,848 B while max_size stays graph 0's 1,654,784 (a legacy running maximum);
    one of its tensors has no name."""
    big = [Event("graph"), Event("alloc", tensor="inp", op="GET_ROWS", size=RUNNING_MAX, offset=0, block=0)]
    small = [Event("graph"),
             Event("alloc", tensor="x", op="ADD", size=204_800, offset=0, block=0),
             Event("alloc", tensor="", op="MUL", size=2_048, offset=204_800, block=0),
             Event("free", tensor="x", op="ADD", size=204_800, offset=0)]
    meta = TraceMeta(name="running max across graphs", source="test", generation="ggml-2023-08-16",
                     profile="ggml-2023-08-16")
    return meta, [GraphRecord(0, "measure", big, max_size=RUNNING_MAX),
                  GraphRecord(1, "eval", small, max_size=RUNNING_MAX)]


@pytest.fixture(scope="session")
def server(tmp_path_factory, fixtures):
    """A real uvicorn on a free loopback port over a fresh store holding the legacy harness
    trace (uploaded over HTTP) and a trace with a hostile name (stored directly)."""
    store_dir = tmp_path_factory.mktemp("store")
    store = open_store(store_dir)
    hostile_id = store.add_trace(*hostile_trace())
    running_max_id = store.add_trace(*running_max_trace())
    store.close()
    with live_server(store_dir) as base:
        log = fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"
        with open(log, "rb") as f:
            r = httpx.post(f"{base}/api/traces", files={"file": (log.name, f)}, data={"name": "legacy harness"},
                           timeout=60)
        assert r.status_code == 201, r.text
        yield {"base": base, "legacy": r.json()["traces"][0]["id"], "hostile": hostile_id,
               "running_max": running_max_id, "fixtures": fixtures}




def shot(page, name: str):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"web-{name}.png"), full_page=True)


def api(server, path: str):
    r = httpx.get(server["base"] + path, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def wait_map(page, selector="#map"):
    page.wait_for_selector(f"{selector}[data-ready='1']", timeout=30000)


def drawn_rectangles(page, selector="#map") -> int:
    """Rectangles on a map: each is one null-terminated polygon in a filled trace."""
    return page.evaluate("""sel => document.querySelector(sel).data
        .filter(t => t.fill === 'toself').reduce((n, t) => n + t.x.filter(v => v === null).length, 0)""", selector)


def selected_event(page) -> int:
    return int(page.get_attribute("#event-table tr.selected", "data-i"))


# --- home and upload ------------------------------------------------------------------------
def test_upload_through_the_page_lists_the_trace(server, page, fixtures):
    page.goto(server["base"] + "/")
    page.wait_for_selector("#trace-table")
    page.fill("#upload-name", "fixed allocator, uploaded by the page")
    page.set_input_files("#file", str(fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"))
    page.wait_for_function("document.getElementById('upload-status').textContent.startsWith('Stored')")
    row = page.locator("#trace-table tr", has_text="fixed allocator, uploaded by the page")
    row.wait_for()
    assert page.get_attribute("#upload-progress", "value") == "100"
    stored = [t for t in api(server, "/api/traces")["traces"] if t["name"] == "fixed allocator, uploaded by the page"]
    assert len(stored) == 1 and len(stored[0]["graphs"]) == 2
    # the fixed allocator fits: measure max_size 12,304 bytes (fixtures README), no OOM badge
    assert row.locator(".badge.ok").count() == 1 and row.locator(".badge.oom").count() == 0
    assert row.locator(".bytes").get_attribute("title") == "12,304 B"
    assert row.locator("a.open-diff").get_attribute("href") == f"/diff?a={stored[0]['id']}%3A0&b={stored[0]['id']}%3A1"
    legacy_row = page.locator(f"#trace-table tr[data-id='{server['legacy']}']")
    badge = legacy_row.locator(".badge.oom")
    assert badge.inner_text() == "OOM in graph 1"
    assert badge.get_attribute("href") == f"/traces/{server['legacy']}?g=1"  # the failing graph
    shot(page, "home")


def test_garbage_upload_shows_the_servers_reason(server, page, tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("no allocator lines here\n")
    before = len(api(server, "/api/traces")["traces"])
    page.goto(server["base"] + "/")
    page.set_input_files("#file", str(bad))
    page.wait_for_selector("#upload-status.error")
    assert page.inner_text("#upload-status").startswith("Upload refused:")
    assert len(api(server, "/api/traces")["traces"]) == before


# --- trace view -----------------------------------------------------------------------------
def test_trace_view_draws_the_map_free_list_and_oom(server, page):
    tid = server["legacy"]
    page.goto(f"{server['base']}/traces/{tid}?g=1")
    wait_map(page)
    mm = api(server, f"/api/traces/{tid}/graphs/1/memory-map?max_shapes=4000")
    assert drawn_rectangles(page) == len(mm["shapes"]) > 10
    names = page.evaluate("document.getElementById('map').data.map(t => t.name)")
    assert "largest free block" in names and "free blocks (count)" in names
    assert any(n.startswith("allocator max_size") for n in names) and any(n.startswith("buffer size") for n in names)
    notes = page.evaluate("document.getElementById('map').layout.annotations.map(a => a.text)")
    assert any("out of space at event 118" in n and "fc_b" in n for n in notes)
    # exact bytes where the difference matters (fixtures README: needed 4096, largest block available 2064)
    page.wait_for_selector("#oom-card h2:has-text('at event')")
    card = page.inner_text("#oom-card")
    assert "fc_b needed 4.00 KiB (4,096 B); the largest free block was 2.02 KiB (2,064 B)." in card
    assert f"Short by 1.98 KiB ({4096 - 2064:,} B) in one block." in card
    # the failing event is selected in the table and its state drawn as an address bar
    page.wait_for_selector("#event-table tr.selected")
    assert page.inner_text("#event-table tr.selected td:nth-child(2)") == "oom"
    page.wait_for_function("document.getElementById('state').data && document.getElementById('state').data.length == 2")
    oom_at = selected_event(page)
    # the state the allocator saw before the failing event: events 0..oom_at-1 applied
    state = api(server, f"/api/traces/{tid}/graphs/1/state?event={oom_at}")
    bars = page.evaluate("document.getElementById('state').data.map(t => t.x.length)")
    assert bars == [len(state["live"]), len(state["free_blocks"])]
    shot(page, "trace")


def test_event_table_and_map_are_linked_both_ways(server, page):
    tid = server["legacy"]
    page.goto(f"{server['base']}/traces/{tid}?g=1")
    wait_map(page)
    page.click("#event-table tr[data-i='10']")
    marker = "document.getElementById('map').layout.shapes.filter(s => s.line && s.line.dash === 'dot').map(s => s.x0)"
    page.wait_for_function(f"{marker}.includes(10)")
    assert "Event 10" in page.inner_text("#selection")
    page.focus("#event-scroll")
    page.keyboard.press("j")
    assert selected_event(page) == 11
    page.keyboard.press("k")
    page.keyboard.press("k")
    assert selected_event(page) == 9
    page.keyboard.press("ArrowDown")
    assert selected_event(page) == 10
    page.wait_for_function(f"{marker}.includes(10)")
    # a click on the map selects the event under the pointer and scrolls the table to it
    page.eval_on_selector("#map", "m => m.scrollIntoView({block: 'start'})")
    x, y = page.evaluate("""() => { const gd = document.getElementById('map'), L = gd._fullLayout, b = gd.getBoundingClientRect();
        return [b.left + L.xaxis._offset + L.xaxis.l2p(60), b.top + L.yaxis._offset + L.yaxis._length / 2]; }""")
    page.mouse.click(x, y)
    page.wait_for_function("document.querySelector('#event-table tr.selected').dataset.i != '10'")
    assert abs(selected_event(page) - 60) <= 1
    row = page.locator("#event-table tr.selected").bounding_box()
    box = page.locator("#event-scroll").bounding_box()
    assert box["y"] <= row["y"] and row["y"] + row["height"] <= box["y"] + box["height"] + 1


def test_zoom_fetches_detail_for_the_window(server, page):
    tid = server["legacy"]
    requests = []
    page.on("request", lambda r: requests.append(r.url) if "/memory-map?" in r.url else None)
    page.goto(f"{server['base']}/traces/{tid}?g=0")
    wait_map(page)
    page.evaluate("Plotly.relayout('map', {'xaxis.range': [20, 60], 'yaxis.range': [0, 8192]})")
    page.wait_for_function("Number(document.getElementById('map').dataset.fetches || 0) >= 1")
    windowed = [u for u in requests if "x0=20" in u and "x1=60" in u and "y1=8192" in u]
    assert windowed, requests
    query = windowed[-1].split("/memory-map?", 1)[1]
    mm = api(server, f"/api/traces/{tid}/graphs/0/memory-map?{query}")
    assert drawn_rectangles(page) == len(mm["shapes"])
    full = api(server, f"/api/traces/{tid}/graphs/0/memory-map")
    assert len(mm["shapes"]) < len(full["shapes"])
    assert page.evaluate("document.getElementById('map')._fullLayout.xaxis.range") == [20, 60]


# --- diff view ------------------------------------------------------------------------------
def test_diff_view_names_the_divergence_and_explains_the_oom(server, page):
    tid = server["legacy"]
    page.goto(f"{server['base']}/diff?a={tid}:0&b={tid}:1")
    page.wait_for_selector("body[data-maps-ready='1']", timeout=30000)
    diff = api(server, f"/api/diff?a={tid}:0&b={tid}:1")
    first = diff["first_divergence"]
    a, b = first["a"], first["b"]
    # the headline states the request and both choices, with exact block sizes
    assert page.inner_text("#divergence-words") == (
        f"{first['tensor']} asked for 2.00 KiB ({a['size']:,} B). a (measure) took block {a['block']}, 4.00 KiB ({a['block_size']:,} B), "
        f"at offset {a['offset']:,}; b (eval) took block {b['block']}, 3.02 KiB ({b['block_size']:,} B), at offset {b['offset']:,}.")
    reasoning = page.inner_text("#divergence-reasoning")
    assert "Best fit takes the smallest free block that holds the request" in reasoning
    assert "the smallest block that holds 2.00 KiB" in reasoning
    assert f"The free lists were the same except the last block: the endless last block in a (measure), 3.02 KiB ({b['block_size']:,} B) in b (eval)." in reasoning
    for sel, x in (("#map-a", first["event_a"]), ("#map-b", first["event_a"])):
        notes = page.evaluate(f"document.querySelector('{sel}').layout.annotations.map(a => [a.text, a.x])")
        assert [f"first divergence: {first['tensor']} (event {first['event_a']})", x] in notes
    # what best fit searched in each run: the free lists before the divergent event, the choice outlined
    for side, ev in (("a", first["event_a"]), ("b", first["event_b"])):
        page.wait_for_selector(f"#state-{side}[data-event='{ev}']")
        free = page.evaluate(f"document.getElementById('state-{side}').data[1].base")
        assert free == [o for o, _, _ in first[side]["free_blocks"]]
        outline = page.evaluate(f"document.getElementById('state-{side}').layout.shapes[0]")
        assert outline["x0"] == first[side]["offset"] and outline["x1"] == first[side]["offset"] + first[side]["size"]
    # the free-lists card places itself after the divergence instead of seeming to contradict it
    ffl = diff["first_free_list_divergence"]
    assert ffl["event_a"] > first["event_a"]
    assert f"This follows from the divergence at event {first['event_a']}" in page.inner_text("#free-lists-card")
    # the legacy real run fails (fixtures README: needed 4096, largest block available 2064), numbered as on
    # the trace page (its oom event)
    card = page.inner_text("#ooms")
    oom_event = api(server, f"/api/traces/{tid}/graphs/1/events?kind=oom")["events"][0]["i"]
    assert f"b (eval) ran out of space at event {oom_event}" in card
    assert "fc_b needed 4.00 KiB (4,096 B); the largest free block was 2.02 KiB (2,064 B)." in card
    assert page.inner_text("#decisions-table tbody tr:first-child td:nth-child(2)") == first["tensor"]
    page.click("#jump")
    page.wait_for_function(f"""() => {{ const r = document.getElementById('map-a')._fullLayout.xaxis.range;
        return r[0] < {first['event_a']} && {first['event_a']} < r[1] && r[1] - r[0] < 125; }}""")
    page.wait_for_function("""() => JSON.stringify(document.getElementById('map-a')._fullLayout.xaxis.range)
        === JSON.stringify(document.getElementById('map-b')._fullLayout.xaxis.range)""")
    shot(page, "diff")
    # the card opens graph b's trace view at the divergence, selected in the table
    page.click("#open-b")
    page.wait_for_url(f"**/traces/{tid}?g=1&event={first['event_b']}")
    wait_map(page)
    page.wait_for_function(f"document.querySelector('#event-table tr.selected')?.dataset.i == '{first['event_b']}'")
    assert page.inner_text("#event-table tr.selected td.tensor") == first["tensor"]


def test_replay_form_lands_in_the_diff_view(server, page):
    page.goto(server["base"] + "/replay")
    page.wait_for_selector("#preset option[value='gpt2-tiny']", state="attached")
    # the defaults reproduce the seed: llama2-70b, ggml-2023-08-16, Metal's order
    assert [page.input_value(s) for s in ("#preset", "#profile", "#metal")] == ["llama2-70b", "ggml-2023-08-16", "true"]
    page.fill("#n_ctx", "0")
    page.click("#run")
    assert page.inner_text("#replay-status") == "Context (n_ctx): must be a whole number ≥ 1, not “0”"
    page.select_option("#preset", "gpt2-tiny")
    page.select_option("#profile", "ggml-2023-08-16")
    page.fill("#n_ctx", "128")
    page.fill("#n_batch", "8")
    shot(page, "replay")
    page.click("#run")
    page.wait_for_url("**/diff?**", timeout=60000)
    page.wait_for_selector("body[data-maps-ready='1']", timeout=30000)
    replays = [t for t in api(server, "/api/traces")["traces"] if t["source"] == "replay"]
    assert len(replays) == 1
    rid = replays[0]["id"]
    assert page.url.endswith(f"/diff?a={rid}%3A0&b={rid}%3A1")
    assert drawn_rectangles(page, "#map-a") > 0 and drawn_rectangles(page, "#map-b") > 0
    shot(page, "replay-diff")


# --- names are data ---------------------------------------------------------------------------
def test_a_tensor_named_like_markup_is_shown_as_text(server, page):
    page.goto(server["base"] + "/")
    row = page.locator(f"#trace-table tr[data-id='{server['hostile']}']")
    assert row.locator(".trace-name").inner_text() == HOSTILE
    page.goto(f"{server['base']}/traces/{server['hostile']}")
    wait_map(page)
    assert page.inner_text("#title") == HOSTILE
    page.wait_for_selector("#event-table td.tensor")
    cells = page.locator("#event-table td.tensor").all_inner_texts()
    assert cells.count(HOSTILE) == 2
    # hover a rectangle: the tooltip names it, as text
    x, y = page.evaluate("""() => { const gd = document.getElementById('map'), L = gd._fullLayout, b = gd.getBoundingClientRect();
        return [b.left + L.xaxis._offset + L.xaxis.l2p(2), b.top + L.yaxis._offset + L.yaxis.l2p(2048)]; }""")
    page.mouse.move(x, y)
    page.wait_for_selector(".map-tip", state="visible")
    assert page.inner_text(".map-tip").splitlines()[0] == HOSTILE
    assert page.locator("#map text", has_text=HOSTILE).count() >= 1  # its label inside the rectangle
    page.click("#event-table tr[data-i='1']")
    page.wait_for_selector("#selection .tensor")
    assert HOSTILE in page.inner_text("#selection")
    assert page.locator("img").count() == 0 and page.dialogs == []
    shot(page, "hostile-name")


# --- first-hour items (issue 12) --------------------------------------------------------------------
def map_colours(page, selector="#map") -> dict:
    """{op: fill colour} of the map's rectangles, as drawn."""
    return page.evaluate("""sel => Object.fromEntries(document.querySelector(sel).data
        .filter(t => t.fill === 'toself').map(t => [t.name, t.line.color]))""", selector)


def test_the_modebar_offers_nothing_that_uploads(server, page):
    page.goto(f"{server['base']}/traces/{server['legacy']}?g=1")
    wait_map(page)
    titles = page.eval_on_selector_all("#map .modebar-btn", "bs => bs.map(b => b.getAttribute('data-title'))")
    assert titles and "Zoom in" in titles
    assert not [t for t in titles if "cloud" in t.lower() or "chart studio" in t.lower() or "edit" in t.lower()]


def test_a_graph_shows_its_own_high_water_beside_the_running_max(server, page):
    page.goto(f"{server['base']}/traces/{server['running_max']}?g=1")
    wait_map(page)
    facts = page.inner_text("#facts")
    assert "HIGH WATER (THIS GRAPH)\n202.00 KiB (206,848 B)" in facts
    assert f"ALLOCATOR MAX_SIZE\n1.58 MiB ({RUNNING_MAX:,} B)" in facts
    # the map is scaled to the graph, not squeezed under a line far above it
    top = page.evaluate("document.getElementById('map')._fullLayout.yaxis.range[1]")
    assert 206_848 <= top < 1.1 * 206_848
    assert "running maximum over every graph measured" in page.inner_text("#map-note")
    # its events carry no free-list facts, so there is no empty free-list panel
    assert "largest free block" not in page.evaluate("document.getElementById('map').data.map(t => t.name)")
    # an unnamed tensor gets a readable label from its op and offset
    page.wait_for_selector("#event-table td.tensor")
    assert "(unnamed MUL result at 204,800)" in page.locator("#event-table td.tensor").all_inner_texts()
    shot(page, "running-max")


def test_state_before_an_event_in_the_maps_colours(server, page):
    tid = server["legacy"]
    diff = api(server, f"/api/diff?a={tid}:0&b={tid}:1")["first_divergence"]
    i = diff["event_b"]
    page.goto(f"{server['base']}/traces/{tid}?g=1&event={i}")
    wait_map(page)
    page.wait_for_function(f"document.getElementById('state').dataset.event === '{i}'")
    assert page.inner_text("#state-note").startswith(f"Before event {i} (what the allocator saw)")
    before = api(server, f"/api/traces/{tid}/graphs/1/state?event={i}")  # events 0..i-1 applied
    assert [b["offset"] for b in before["free_blocks"]] == [o for o, _, _ in diff["b"]["free_blocks"]]
    bars = page.evaluate("document.getElementById('state').data.map(t => [t.name, t.x.length, t.marker.color])")
    live, free = bars
    assert live[1] == len(before["live"]) and free[1] == len(before["free_blocks"])
    # the chosen placement is outlined where the event put it
    outline = page.evaluate("document.getElementById('state').layout.shapes[0]")
    assert (outline["x0"], outline["x1"]) == (diff["b"]["offset"], diff["b"]["offset"] + diff["b"]["size"])
    # live tensors wear their op's colour from the map; free blocks a colour no op on the map has
    colours = map_colours(page)
    ops = [t.get("op") for t in before["live"]]
    assert all(ops) and live[2] == [colours[op] for op in ops]
    assert not set(free[2]) & set(colours.values())


def test_op_colours_agree_across_graphs_and_traces(server, page):
    seen = []
    for path in (f"/traces/{server['legacy']}?g=0", f"/traces/{server['legacy']}?g=1", f"/traces/{server['hostile']}",
                 f"/traces/{server['running_max']}?g=1"):
        page.goto(server["base"] + path)
        wait_map(page)
        seen.append(map_colours(page))
    shared = set(seen[0]) & set(seen[2]) & set(seen[3])
    assert {"ADD", "MUL"} <= shared
    for op in set().union(*seen):
        assert len({s[op] for s in seen if op in s}) == 1, op
    assert len(set(seen[0].values())) == len(seen[0])  # distinct ops, distinct colours on one map


def test_event_table_fits_keeps_the_selection_visible_and_keys_work_anywhere(server, window):
    ctx = window(1600, 1000)
    page = ctx.new_page()
    try:
        page.goto(f"{server['base']}/traces/{server['legacy']}?g=1")
        wait_map(page)
        page.wait_for_selector("#event-table tr.selected")
        last = page.locator("#event-table thead th").last.bounding_box()
        box = page.locator("#event-scroll").bounding_box()
        assert last["x"] + last["width"] <= box["x"] + box["width"] + 1  # no clipped last column
        page.click("#event-table tr[data-i='60']")
        page.click("h1")  # the keys work without focusing the table
        page.keyboard.press("j")
        assert selected_event(page) == 61
        page.eval_on_selector("#event-scroll", "s => { s.scrollTop = document.querySelector(\"tr[data-i='61']\").offsetTop - 40; }")
        for _ in range(3):
            page.keyboard.press("k")
        assert selected_event(page) == 58
        row = page.locator("#event-table tr.selected").bounding_box()
        head = page.locator("#event-table thead").bounding_box()
        assert row["y"] >= head["y"] + head["height"] - 1  # not hidden under the sticky header
        page.fill("#search", "kq")  # typing in a field is not a key command
        assert selected_event(page) == 58
    finally:
        ctx.close()


def test_search_highlights_matches_and_the_view_survives_a_reload(server, page):
    tid = server["legacy"]
    page.goto(f"{server['base']}/traces/{tid}?g=1")
    wait_map(page)
    shapes = api(server, f"/api/traces/{tid}/graphs/1/memory-map?max_shapes=3000")["shapes"]
    page.fill("#search", "NORM")
    want = {s["tensor"] for s in shapes if "norm" in s["tensor"].lower()}
    page.wait_for_function(f"document.getElementById('search-count').dataset.count === '{len(want)}'")
    outlined = page.evaluate("document.getElementById('map').data.find(t => t.name === 'search matches').x.filter(v => v === null).length")
    assert outlined == sum(1 for s in shapes if "norm" in s["tensor"].lower()) and len(want) >= 2
    page.check("#search-regex")
    page.fill("#search", "^fc_")
    want = {s["tensor"] for s in shapes if s["tensor"].startswith("fc_")}
    page.wait_for_function(f"document.getElementById('search-count').dataset.count === '{len(want)}'")
    page.evaluate("Plotly.relayout('map', {'xaxis.range': [20, 80], 'yaxis.range': [1000, 9000]})")
    page.click("#event-table tr[data-i='30']")
    page.wait_for_function("location.search.includes('event=30') && location.search.includes('x0=20')")
    shared = page.url
    for key in ("x0=20", "x1=80", "y0=1000", "y1=9000", "event=30", "q=%5Efc_", "re=1"):
        assert key in shared, shared
    page.goto(shared)
    wait_map(page)
    page.wait_for_selector("#event-table tr.selected[data-i='30']")
    assert page.evaluate("document.getElementById('map')._fullLayout.xaxis.range") == [20, 80]
    assert page.evaluate("document.getElementById('map')._fullLayout.yaxis.range") == [1000, 9000]
    assert page.input_value("#search") == "^fc_" and page.is_checked("#search-regex")
    page.wait_for_function("document.getElementById('search-count').dataset.count !== undefined")
    shot(page, "search")


def test_dark_mode_follows_the_system(server, window):
    ctx = window(1400, 1000, color_scheme="dark")
    page = ctx.new_page()
    try:
        page.goto(f"{server['base']}/traces/{server['legacy']}?g=1")
        wait_map(page)
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(18, 21, 27)"
        assert page.evaluate("document.getElementById('map').layout.paper_bgcolor") == "#1b1f27"
        shot(page, "dark")
    finally:
        ctx.close()


def test_loading_indicators_show_until_the_data_arrives(server, page):
    held = []
    page.route("**/memory-map?**", lambda route: held.append(route))
    page.goto(f"{server['base']}/traces/{server['legacy']}?g=1", wait_until="domcontentloaded")
    page.wait_for_selector("#map .loading")
    assert page.inner_text("#map .loading") == "Loading the memory map…"
    assert page.get_attribute("#map", "aria-busy") == "true"
    while not held:
        page.wait_for_timeout(20)
    for r in held:
        r.continue_()
    page.unroute("**/memory-map?**")
    wait_map(page)
    assert page.locator("#map .loading").count() == 0


def test_dropping_a_file_anywhere_uploads_it(server, page):
    text = (server["fixtures"] / "v2023-08-16-legacy" / "harness_plain.AT.log").read_text()
    page.goto(f"{server['base']}/traces/{server['hostile']}")
    wait_map(page)
    page.evaluate("""text => { const dt = new DataTransfer(); dt.items.add(new File([text], 'dropped.AT.log'));
        for (const type of ['dragenter', 'dragover', 'drop'])
          document.querySelector('main').dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true})); }""", text)
    page.wait_for_url(lambda u: "/traces/" in u and server["hostile"] not in u)
    wait_map(page)
    new_id = page.url.split("/traces/")[1].split("?")[0]
    assert api(server, f"/api/traces/{new_id}")["name"] == "dropped.AT.log"
    httpx.delete(f"{server['base']}/api/traces/{new_id}")


def test_the_chrome_trace_export_is_a_download_on_the_page(server, page):
    page.goto(f"{server['base']}/traces/{server['legacy']}?g=1")
    with page.expect_download() as dl:
        page.click("#export-chrome")
    data = json.loads(Path(dl.value.path()).read_text())
    assert dl.value.suggested_filename == f"trace-{server['legacy']}.chrome.json"
    names = {e.get("name") for e in data["traceEvents"]}
    assert {"fc_b", "KQV"} <= names


def test_identical_replays_are_kept_once(server):
    req = {"preset": "gpt2-tiny", "profile": "ggml-2023-08-22", "n_ctx": 128, "n_batch": 8, "metal_concurrency": False}
    first = httpx.post(f"{server['base']}/api/replay", json=req, timeout=60).json()
    second = httpx.post(f"{server['base']}/api/replay", json=req, timeout=60).json()
    assert second["reused"] is True and second["traces"][0]["id"] == first["traces"][0]["id"]
    named = [t for t in api(server, "/api/traces")["traces"] if t["name"] == first["traces"][0]["name"]]
    assert len(named) == 1
    httpx.delete(f"{server['base']}/api/traces/{named[0]['id']}")


def test_validation_errors_name_the_field(server, page):
    r = httpx.post(f"{server['base']}/api/replay", json={"preset": "gpt2-tiny", "profile": "ggml-2023-08-16", "n_batch": 0})
    assert r.status_code == 422
    page.goto(server["base"] + "/replay")
    text = page.evaluate("body => import('/static/api.js').then(m => m.detailText(body, 422))", r.json())
    assert text == "n_batch: Input should be greater than or equal to 1"


def test_names_wrap_between_words_only(server, window):
    ctx = window(900, 900)
    page = ctx.new_page()
    try:
        page.goto(server["base"] + "/")
        page.wait_for_selector("#trace-table")
        lines = page.eval_on_selector_all("#trace-table .word, #trace-table code, #trace-table .badge",
                                          "ws => ws.map(w => w.getClientRects().length)")
        assert lines and set(lines) == {1}
        shot(page, "home-narrow")
    finally:
        ctx.close()
