"""The dashboard lands on the answer (a failed run opens on its failure card), bad links answer the friendly page,
and /docs is the dashboard's own page: it works with the network off and needs the API's token. Real Chromium
against a real server."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from alloctrace.traces import import_paths
from alloctrace.traces.store.store import open_store
from conftest import live_server

pytest.importorskip("playwright.sync_api")

DATA = Path(__file__).resolve().parents[1] / "data"
LEGACY = DATA / "ggml-real" / "v2023-08-16-legacy" / "harness_plain.AT.log"  # graph 0 measures, graph 1 fails
EXPLAIN = DATA / "explain"
TORCH_OOM = DATA / "torch" / "oom.pickle.gz"
TOKEN = "answers-token_1"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("answers-store")
    store = open_store(store_dir)
    [legacy] = import_paths(store, [LEGACY], name="legacy harness")
    [torch] = import_paths(store, [TORCH_OOM], name="torch oom")
    # a second copy: same bytes, another tag (the same bytes and tags are stored once)
    [torch2] = import_paths(store, [TORCH_OOM], name="torch oom again", tags=["copy=2"])
    store.close()
    tagged = []
    for ub in (8, 64):  # two runs of one program with different flags, tagged
        out = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(EXPLAIN / f"llama-tiny_c512_ub{ub}.head.AT.log.gz"),
                              "--store", str(store_dir), "--name", f"llama ub {ub}", "--tag", "model=llama", "--json"],
                             capture_output=True, text=True, timeout=120, check=True)
        tagged.append(json.loads(out.stdout)["traces"][0]["id"])
    with live_server(store_dir) as base:
        yield {"base": base, "legacy": legacy, "torch": torch, "torch2": torch2, "ub8": tagged[0], "ub64": tagged[1],
               "store": store_dir}


def in_viewport(page, selector) -> bool:
    return page.eval_on_selector(selector, """e => { const r = e.getBoundingClientRect();
        return r.height > 0 && r.top >= 0 && r.top < window.innerHeight && r.bottom > 0; }""")


def test_a_failed_ggml_run_opens_on_the_failing_graph_with_its_card_first(site, page):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{site['base']}/traces/{site['legacy']}")
    page.wait_for_selector("#map[data-ready='1']", timeout=60000)
    page.wait_for_selector("#oom-card h2:has-text('at event')")  # the full card, after the failing event is selected
    page.wait_for_selector("#event-table tr.selected")
    assert "g=1" in page.url
    card = page.inner_text("#oom-card")
    assert "Graph 1 ran out of space" in card and "needed" in card and "largest free block" in card
    assert in_viewport(page, "#oom-card-body"), "the out-of-space card must be on the first screen"
    assert page.evaluate("window.scrollY") == 0  # selecting the failing row scrolled only the table's own box
    # a link that names a graph still opens that graph
    page.goto(f"{site['base']}/traces/{site['legacy']}?g=0")
    page.wait_for_selector("#map[data-ready='1']", timeout=60000)
    assert page.locator("#oom-card-body").count() == 0


def test_a_pytorch_oom_page_keeps_its_card_on_the_first_screen(site, page):
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{site['base']}/torch?id={site['torch']}&view=oom")
    page.wait_for_selector("#oom h2", timeout=60000)
    page.wait_for_function("() => !document.querySelector('[aria-busy=\"true\"]')", timeout=60000)
    page.wait_for_timeout(300)
    assert in_viewport(page, "#oom h2")


@pytest.mark.parametrize("path,words", [
    ("/sweep?id=nope", "not valid"),
    ("/sweep?id=0123abcd", "not in the store"),
])
def test_a_bad_sweep_link_answers_the_friendly_page(site, page, path, words):
    page.goto(site["base"] + path)
    card = page.locator("#error-page")
    card.wait_for()
    text = card.inner_text()
    assert words in text and "sweep" in text
    assert "pattern" not in text and "String should match" not in text
    assert card.locator("a[href='/']").count() == 1


def test_the_api_docs_render_with_the_network_off(site, page):
    outside = []

    def only_loopback(route):
        if route.request.url.startswith(site["base"]):
            return route.continue_()
        outside.append(route.request.url)
        return route.abort("internetdisconnected")

    page.route("**/*", only_loopback)
    page.goto(site["base"] + "/docs")
    page.wait_for_selector("body[data-loaded='1']")
    assert outside == []  # nothing was asked of another site
    count = int(page.inner_text("#endpoint-count").split()[0])
    assert count >= 20
    assert page.locator("section.endpoint[data-path='/api/traces'][data-method='get']").count() == 1
    assert "Diff two graphs" in page.inner_text("section.endpoint[data-path='/api/diff']")


def test_the_api_docs_need_the_token_as_the_api_does(site, browser):
    with live_server(site["store"], token=TOKEN) as base:
        for path in ("/docs", "/openapi.json", "/api/traces"):
            assert httpx.get(base + path).status_code == 401, path
            assert httpx.get(base + path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path
        assert httpx.get(base + "/docs?token=wrong").status_code == 401
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            page.goto(f"{base}/docs?token={TOKEN}")  # the cookie it sets lets the page read /openapi.json
            page.wait_for_selector("body[data-loaded='1']")
            assert page.locator("section.endpoint").count() >= 20
        finally:
            ctx.close()


def test_two_traces_ticked_on_the_home_list_open_their_diff(site, page):
    page.goto(site["base"] + "/")
    page.wait_for_selector("#trace-table")
    assert page.locator("#diff-selected").is_hidden()
    # the tag filter leaves the two tagged runs
    page.select_option("#tag-filter", "model=llama")
    ids = page.eval_on_selector_all("#trace-table tbody tr", "rs => rs.map(r => r.dataset.id)")
    assert sorted(ids) == sorted([site["ub8"], site["ub64"]])
    page.check(f"tr[data-id='{site['ub64']}'] input.pick")
    page.check(f"tr[data-id='{site['ub8']}'] input.pick")
    link = page.locator("#diff-selected")
    assert link.is_visible()
    assert link.get_attribute("href") == f"/diff?a={site['ub64']}%3A0&b={site['ub8']}%3A0"  # a: ticked first
    link.click()
    page.wait_for_selector("#summary-table", timeout=60000)
    assert page.url.endswith(f"/diff?a={site['ub64']}%3A0&b={site['ub8']}%3A0")


def test_a_third_tick_replaces_the_oldest_and_pytorch_pairs_link_to_the_same_page(site, page):
    page.goto(site["base"] + "/")
    page.wait_for_selector("#trace-table")
    from playwright.sync_api import expect

    for key in ("legacy", "torch", "torch2"):
        page.check(f"tr[data-id='{site[key]}'] input.pick")
    # the page may redraw its list meanwhile (a busy machine): wait for the state, never sample it once
    expect(page.locator(f"tr[data-id='{site['legacy']}'] input.pick")).not_to_be_checked()
    expect(page.locator("#diff-selected")).to_have_attribute(
        "href", f"/diff?a={site['torch']}%3A0&b={site['torch2']}%3A0")
    # a failed ggml run is diffed from its failing graph
    page.uncheck(f"tr[data-id='{site['torch2']}'] input.pick")
    page.uncheck(f"tr[data-id='{site['torch']}'] input.pick")
    page.check(f"tr[data-id='{site['legacy']}'] input.pick")
    page.check(f"tr[data-id='{site['ub8']}'] input.pick")
    assert page.get_attribute("#diff-selected", "href").startswith(f"/diff?a={site['legacy']}%3A1&b={site['ub8']}%3A")


LONG_NAME = "llama-2-70b-chat.Q4_K_M.gguf_n_ctx=4096_n_batch=512_flash_attn=on_metal_concurrency=on_run-2026-12-03T23-59"


def test_no_page_overflows_a_phone_even_with_long_trace_names(site, window):
    from alloctrace.server.app import PAGES

    store = open_store(site["store"])
    try:
        [long_id] = import_paths(store, [LEGACY], name=LONG_NAME)
    finally:
        store.close()
    paths = list(PAGES) + [f"/traces/{long_id}", f"/traces/{long_id}?g=0", f"/diff?a={long_id}:0&b={site['ub8']}:0",
                           f"/torch?id={site['torch']}", f"/whatif?trace={site['torch']}&device=0", "/sweep?id=nope"]
    ctx = window(390, 844)
    wide = {}
    try:
        for path in paths:
            page = ctx.new_page()
            page.goto(site["base"] + path)
            try:
                page.wait_for_function("() => !document.querySelector('[aria-busy=\"true\"]') && "
                                       "!document.querySelector('.loading')", timeout=45000)
            except Exception:  # noqa: BLE001 - measured anyway: the overflow is what is asserted
                pass
            page.wait_for_timeout(300)
            over = page.evaluate("Math.max(0, document.documentElement.scrollWidth - window.innerWidth)")
            if over:
                wide[path] = over
            page.close()
    finally:
        ctx.close()
    assert wide == {}, f"wider than 390 px: {wide}"


def test_the_graph_pairing_of_two_runs_is_shown_and_can_be_changed(site, page):
    page.goto(site["base"] + "/")
    page.wait_for_selector("#trace-table")
    page.check(f"tr[data-id='{site['legacy']}'] input.pick")
    page.check(f"tr[data-id='{site['ub8']}'] input.pick")
    # the pairing chosen: a's failing eval graph; b (a llama.cpp run of reserve graphs) has no eval graph: its graph 0
    assert page.input_value("#pair-a") == "1" and page.input_value("#pair-b") == "0"
    b_graphs = page.eval_on_selector_all("#pair-b option", "os => os.map(o => o.textContent)")
    assert len(b_graphs) >= 2 and all("eval" not in g for g in b_graphs)
    assert page.get_attribute("#diff-selected", "href") == f"/diff?a={site['legacy']}%3A1&b={site['ub8']}%3A0"
    page.select_option("#pair-a", "0")
    page.select_option("#pair-b", "1")
    assert page.get_attribute("#diff-selected", "href") == f"/diff?a={site['legacy']}%3A0&b={site['ub8']}%3A1"
    page.click("#diff-selected")
    page.wait_for_selector("#summary-table", timeout=60000)
