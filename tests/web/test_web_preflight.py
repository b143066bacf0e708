"""The pre-flight page in a real headless Chromium against a real server: a fit and a sweep of a real ggml program
(its compute buffer recorded, the weights and two KV caches it printed) and a `plan --vary` search of a real
PyTorch step, each drawn as one curve per buffer, KV cache or category against the knob, with the budget line,
the answer, the law's predicted points and the printed sizes' error bars; narrow and bad-link pages."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import live_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_sweep_program import kv_bytes  # noqa: E402
from preflight_results import FIT_BUDGET, PLAN_BUDGET, build  # noqa: E402
from sweep_program import expected_bytes  # noqa: E402

pytest.importorskip("playwright.sync_api")

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TRACES = "() => document.getElementById('pf-chart').data.map(t => ({kind: t.meta.kind, name: t.name, x: t.x, y: t.y, " \
         "dash: t.line && t.line.dash, symbol: t.marker && t.marker.symbol, errors: t.error_y || null, meta: t.meta}))"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preflight")
    got = build(tmp / "store", tmp)
    with live_server(tmp / "store") as base:
        yield {"base": base, **got}


def open_page(page, base: str, pid: str) -> list[dict]:
    page.goto(f"{base}/preflight?id={pid}")
    page.wait_for_selector("body[data-loaded='1']", timeout=30000)
    return page.evaluate(TRACES)


def test_a_fit_draws_every_buffer_and_kv_cache_with_its_budget_and_answer(server, page):
    fit = server["fit"]
    traces = open_page(page, server["base"], fit["sweep"])
    measured = {t["name"]: t for t in traces if t["kind"] == "measured"}
    assert set(measured) == {"CPU compute buffer", "CPU weights", "CUDA0 weights", "CPU KV cache", "CUDA0 KV cache",
                             "total"}
    values = sorted(p["value"] for p in fit["probes"])  # every run of the bisection, not the one stored point
    assert len(values) >= 4 and measured["CPU compute buffer"]["x"] == values
    assert measured["CPU compute buffer"]["y"] == [expected_bytes(c, 32, 2) for c in values]  # exact
    for dev in ("CPU", "CUDA0"):  # printed to two decimals: the true size lies within each error bar
        kv = measured[f"{dev} KV cache"]
        assert kv["errors"]["visible"] and all(abs(y - kv_bytes(dev, c, 2)) <= e
                                               for c, y, e in zip(kv["x"], kv["y"], kv["errors"]["array"]))
    assert not measured["CPU compute buffer"]["errors"]["visible"]
    assert measured["total"]["y"] == [p["total"] for p in sorted(fit["probes"], key=lambda p: p["value"])]
    [budget] = [t for t in traces if t["kind"] == "budget"]
    assert budget["y"] == [FIT_BUDGET, FIT_BUDGET] and budget["dash"] == "dot"
    [answer] = [t for t in traces if t["kind"] == "answer"]
    assert answer["x"] == [fit["value"]] == [192] and answer["y"] == [fit["total"]] and answer["symbol"] == "star"
    # the law's predictions: dashed, open markers, only where nothing ran, and on the line the law gives
    predicted = {t["meta"]["curve"]: t for t in traces if t["kind"] == "predicted"}
    kq = predicted["CPU compute buffer"]
    assert kq["dash"] == "dash" and kq["symbol"] == "circle-open"
    assert kq["meta"]["xs"] and not set(kq["meta"]["xs"]) & set(values)
    for x, y in zip(kq["x"], kq["y"]):
        assert y == expected_bytes(x, 32, 2)  # 4·2·(64·32 + 64·c + 32·c): the exact law, at every x
    assert "CUDA0 KV cache" in predicted  # a line through the rounded sizes' bands
    assert "2,048·-c B" in page.locator("#pf-laws").inner_text()
    assert "Largest -c under 47.00 MiB" in page.locator("#pf-answer").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "preflight-fit.png"), full_page=True)


def test_another_budget_moves_the_line_and_the_answer(server, page):
    traces = open_page(page, server["base"], server["fit"]["sweep"])
    page.fill("#pf-budget", "48MiB")
    page.click("#pf-budget-form button[type=submit]")
    page.wait_for_function("() => document.getElementById('pf-chart').data.some(t => t.meta.kind === 'budget' "
                           "&& t.y[0] === 48 * 1048576)", timeout=20000)
    traces = page.evaluate(TRACES)
    [answer] = [t for t in traces if t["kind"] == "answer"]
    fitting = [p["value"] for p in server["fit"]["probes"] if p["total"] <= 48 << 20]
    assert answer["x"] == [max(fitting)] and "budget=48MiB" in page.url


def test_a_sweep_draws_its_buffers_and_links_both_ways(server, page):
    sid = server["sweep"]["sweep"]
    traces = open_page(page, server["base"], sid)
    names = {t["name"] for t in traces if t["kind"] == "measured"}
    assert {"CPU KV cache", "CUDA0 KV cache", "CPU compute buffer", "total"} <= names
    assert not [t for t in traces if t["kind"] in ("budget", "answer")]  # a sweep has no budget until given one
    page.goto(f"{server['base']}/sweep")
    page.wait_for_selector(f"#rec-list a.preflight-link[href='/preflight?id={sid}']", timeout=20000)
    # a fit's one stored point opens its whole search on the pre-flight page, not as a one-point sweep
    assert page.locator(f"#rec-list a[href='/preflight?id={server['fit']['sweep']}']").count() >= 1
    page.goto(f"{server['base']}/sweep?id={server['fit']['sweep']}")
    page.wait_for_url(f"**/preflight?id={server['fit']['sweep']}", timeout=20000)
    page.goto(server["base"] + "/")
    page.wait_for_selector("a.open-preflight", timeout=20000)
    hrefs = page.eval_on_selector_all("a.open-preflight", "as => as.map(a => a.getAttribute('href'))")
    assert f"/preflight?id={server['fit']['sweep']}" in hrefs and f"/preflight?id={sid}" in hrefs


def test_a_plan_search_draws_categories_against_batch(server, page):
    plan = server["plan"]
    if plan is None:
        pytest.skip("torch is not installed")
    traces = open_page(page, server["base"], plan["plan"])
    measured = {t["name"]: t for t in traces if t["kind"] == "measured"}
    assert {"parameters", "gradients", "optimizer_state", "reserved (max_memory_reserved)",
            "allocated (max_memory_allocated)"} <= set(measured)
    ran = [p for p in plan["points"] if p["oom"] is None]
    reserved = measured["reserved (max_memory_reserved)"]
    assert reserved["x"] == [p["value"] for p in ran] and reserved["y"] == [p["peak_reserved"] for p in ran]
    assert measured["parameters"]["y"] == [p["categories"]["parameters"] for p in ran]
    # each peak's range over where the driver may put segments, as its error bar (none where it does not move)
    for curve, key in [("reserved (max_memory_reserved)", "peak_reserved"), ("allocated (max_memory_allocated)",
                                                                            "peak_allocated")]:
        bars = measured[curve]["errors"]
        assert bars["array"] == [p[f"{key}_range"][1] - p[key] for p in ran]
        assert bars["arrayminus"] == [p[key] - p[f"{key}_range"][0] for p in ran]
        assert bars["visible"] == any(p[f"{key}_range"][0] != p[f"{key}_range"][1] for p in ran)
    failed = [p["value"] for p in plan["points"] if p["oom"] is not None]
    oom = [t for t in traces if t["kind"] == "oom" and t["meta"]["curve"] == "reserved (max_memory_reserved)"]
    assert failed and oom[0]["x"] == failed and oom[0]["symbol"] == "x"  # off the line: counted to the failure
    [budget] = [t for t in traces if t["kind"] == "budget"]
    [answer] = [t for t in traces if t["kind"] == "answer"]
    assert budget["y"] == [PLAN_BUDGET] * 2 and answer["x"] == [plan["value"]]
    assert "parameters: 100,700,160 B (constant) (exact)" in page.locator("#pf-laws").inner_text()


@pytest.mark.parametrize("which", ["fit", "plan"])
def test_narrow_window_has_no_horizontal_overflow(server, window, which):
    if server[which] is None:
        pytest.skip("torch is not installed")
    ctx = window(390, 844)
    page = ctx.new_page()
    try:
        open_page(page, server["base"], server[which]["sweep" if which == "fit" else "plan"])
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
    finally:
        ctx.close()


@pytest.mark.parametrize("pid, words", [("0000dead", "not in the store"), ("no-such!", "not valid")])
def test_a_bad_id_is_a_friendly_not_found(server, page, pid, words):
    page.goto(f"{server['base']}/preflight?id={pid}")
    page.wait_for_selector("#error-page", timeout=20000)
    assert words in page.locator("#error-page").inner_text()
    assert page.locator("#pf-result").is_hidden()


def test_without_an_id_the_page_lists_every_result(server, page):
    page.goto(f"{server['base']}/preflight")
    page.wait_for_selector("body[data-loaded='1']", timeout=20000)
    hrefs = page.eval_on_selector_all("#pf-list a", "as => as.map(a => a.getAttribute('href'))")
    want = {server["fit"]["sweep"], server["sweep"]["sweep"]} | ({server["plan"]["plan"]} if server["plan"] else set())
    assert {h.split("=")[1] for h in hrefs} == want
