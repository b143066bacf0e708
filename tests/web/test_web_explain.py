"""The peak, size-attribution and sweep panels in a real headless Chromium against a real server.

Screenshots go to test-artifacts/explain-*.png. Numbers on screen are checked against the API's answers and against the shapes of the
gpt-2 fixture model (n_embd 128): the n_batch 64 measure peaks in the MLP, two f32
tensors of 4 * n_embd * 64 * 4 bytes.
"""
from pathlib import Path

import httpx
import pytest

from alloctrace.traces.replay.run import replay, store_result
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from conftest import live_server

pytest.importorskip("playwright.sync_api")

DATA = Path(__file__).resolve().parents[1] / "data" / "explain"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MLP = 4 * 128 * 64 * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("store")
    s = open_store(store_dir)
    short, long_ = import_paths(s, [DATA / "gpt-2_tiny_short.2023-08-28.AT.log.gz",
                                    DATA / "gpt-2_tiny_long.2023-08-28.AT+DEBUG.log.gz"])
    failing = store_result(replay("llama2-70b", "ggml-2023-08-16", metal_concurrency=True), s)
    s.close()
    with live_server(store_dir) as base:
        yield {"base": base, "short": short, "long": long_, "failing": failing}




def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"explain-{name}.png"), full_page=True)


def api(server, path):
    r = httpx.get(server["base"] + path, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_peak_panel_highlights_a_family_on_the_map(server, page):
    tid = server["long"]
    peak = api(server, f"/api/traces/{tid}/graphs/0/peak")
    page.goto(f"{server['base']}/traces/{tid}?g=0")
    page.wait_for_selector("#peak[data-ready='1']", timeout=30000)
    page.wait_for_selector("#map[data-ready='1']", timeout=30000)
    # the summary shows the mark in binary units with the exact bytes on hover
    mark = page.locator("#peak-summary .bytes").first
    assert mark.get_attribute("title") == f"{peak['peak']['bytes']:,} B" == "360,976 B"
    assert mark.inner_text() == "352.52 KiB"
    rows = page.locator("#peak-table tbody tr")
    assert rows.count() == len(peak["families"])
    # sorted by bytes: the MLP pair first; a click on the header reverses the order
    assert rows.nth(0).get_attribute("data-family") in ("MUL_MAT", "REPEAT")
    page.click("#peak-table th[data-key='bytes']")
    assert rows.nth(0).get_attribute("data-family") == "NONE"
    page.click("#peak-table th[data-key='bytes']")
    page.locator("#peak-table tbody tr[data-family='MUL_MAT']").click()
    assert page.get_attribute("#peak", "data-selected") == "MUL_MAT"
    assert "selected" in page.get_attribute("#peak-table tr[data-family='MUL_MAT']", "class")
    sel = page.locator("#peak-selection")
    assert sel.locator(".bytes").get_attribute("title") == f"{MLP:,} B"
    assert "1 tensor" in sel.inner_text()
    # the map outlines exactly that family's live tensors at their offsets, and the page jumps to the peak
    shapes = page.evaluate("""() => (document.getElementById('map').layout.shapes || [])
        .filter(s => String(s.name || '').startsWith('peak:')).map(s => [s.y0, s.y1, s.x0, s.x1])""")
    mine = [t for t in peak["tensors"] if t["family"] == "MUL_MAT"]
    assert sorted(shapes) == sorted([[t["y0"], t["y0"] + t["bytes"], t["start"], t["end"]] for t in mine])
    page.wait_for_selector("#event-table tr.selected")
    assert int(page.get_attribute("#event-table tr.selected", "data-i")) == peak["peak"]["event"]
    shot(page, "peak")


def test_peak_panel_on_the_failing_70b_eval(server, page):
    tid = server["failing"]
    peak = api(server, f"/api/traces/{tid}/graphs/1/peak")
    page.goto(f"{server['base']}/traces/{tid}?g=1")
    page.wait_for_selector("#peak[data-ready='1']", timeout=30000)
    fail = page.locator("#peak-failure")
    assert "result_w3" in fail.inner_text()
    titles = [fail.locator(".bytes").nth(i).get_attribute("title") for i in range(3)]
    f = peak["failure"]
    assert titles == [f"{f['needed']:,} B", f"{f['free']:,} B", f"{f['largest_hole']:,} B"]
    assert f["free"] >= f["needed"] > f["largest_hole"]
    page.locator("#peak-table tbody tr").first.click()
    first = peak["families"][0]["family"]
    assert page.get_attribute("#peak", "data-selected") == first


def test_waterfall_beside_the_first_divergence(server, page):
    a, b = f"{server['short']}:0", f"{server['long']}:0"
    att = api(server, f"/api/diff?a={a}&b={b}")["size_attribution"]
    page.goto(f"{server['base']}/diff?a={a}&b={b}")
    page.wait_for_selector("#attribution[data-ready='1']", timeout=30000)
    # beside the divergence card, in the same row; two configurations of a program: the sizes lead (left)
    box_div = page.locator("#divergence").bounding_box()
    box_att = page.locator("#attribution").bounding_box()
    assert abs(box_div["y"] - box_att["y"]) < 80 and box_att["x"] < box_div["x"]
    wf = page.evaluate("() => document.getElementById('attribution-chart').data[0]")
    assert wf["y"][0] == att["a_bytes"] and wf["y"][-1] == att["b_bytes"]
    assert sum(wf["y"][1:-1]) == att["delta"]  # the steps add up to the delta exactly
    page.locator("#attribution-table tr[data-family='REPEAT']").click()
    assert page.get_attribute("#attribution", "data-selected") == "REPEAT"
    status = page.locator("#attribution-selection .bytes")
    assert [status.nth(i).get_attribute("title") for i in range(2)] == ["0 B", f"{MLP:,} B"]
    shapes = page.evaluate("() => document.getElementById('attribution-chart').layout.shapes.map(s => s.name)")
    assert shapes == ["attribution:REPEAT"]
    total = page.locator("#attribution-summary strong")
    assert total.get_attribute("title") == f"{att['delta']:,} B"
    shot(page, "attribution")


def test_sweep_page_from_the_replay_page(server, page):
    page.goto(f"{server['base']}/replay")
    page.click("#to-sweep")
    page.wait_for_url("**/sweep")
    page.select_option("#preset", "llama2-70b")
    page.fill("#n_ctx", "256,512")
    page.select_option("#metal", "true")
    page.click("#run")
    page.wait_for_selector("#result[data-ready='1']", timeout=60000)
    rows = page.locator("#sweep-table tbody tr")
    assert rows.count() == 4
    assert page.locator("#sweep-table tbody tr.bad").count() == 1
    assert "ggml-2023-08-16 runs out of space from n_ctx 512" in page.locator("#onset").inner_text()
    lines = page.evaluate("() => document.getElementById('sweep-chart').data.map(t => [t.name, t.x, t.y])")
    got = api(server, "/api/sweep?preset=llama2-70b&profile=ggml-2023-08-16,ggml-2023-08-28&n_ctx=256,512"
                      "&n_batch=512&metal_concurrency=true")["points"]
    assert lines == [[prof, [256, 512], [p["max_size"] for p in got if p["profile"] == prof]]
                     for prof in ("ggml-2023-08-16", "ggml-2023-08-28")]
    hover = page.evaluate("() => document.getElementById('sweep-chart').data[0].customdata[1]")
    assert hover[1] == f"{got[1]['max_size']:,} B" and "result_w1" in hover[2]
    page.locator("#sweep-table button.family[data-family='result_w1']").first.click()
    assert page.get_attribute("#result", "data-selected") == "result_w1"
    assert page.locator("#sweep-table tbody tr.selected").count() == 4
    assert "result_w1 dominates 4 of 4 points" in page.locator("#sweep-selection").inner_text()
    assert "preset=llama2-70b" in page.url and "n_ctx=256%2C512" in page.url  # the URL holds the sweep
    shot(page, "sweep")
