"""The sweep page's recorded sweeps in a real headless Chromium against a real server: a sweep of the real ggml
program of tests/sweep_program.py (-c 128, 256, 512 x -fa on, off), its chart checked against the API and the
formula, a click on a point opening its trace and the diff to its neighbour."""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import httpx
import pytest

from alloctrace.cli import main
from conftest import live_server
from sweep_program import expected_bytes

pytest.importorskip("playwright.sync_api")

PROGRAM = [sys.executable, str(Path(__file__).parents[1].joinpath("sweep_program.py"))]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["sweep", "--store", str(store), "--vary=-c=128,256,512", "--vary=-fa=off,on", "--json", "--",
                   *PROGRAM, "-ub", "32", "-nh", "2"])
    assert rc == 0, err.getvalue()
    with live_server(store) as base:
        yield {"base": base, "sweep": json.loads(out.getvalue())}


def test_api_lists_and_answers_recorded_sweeps(server):
    sid = server["sweep"]["sweep"]
    listed = httpx.get(server["base"] + "/api/sweeps", timeout=30).json()["sweeps"]
    assert [(s["sweep"], s["points"]) for s in listed] == [(sid, 6)]
    got = httpx.get(server["base"] + f"/api/sweeps/{sid}", timeout=60).json()
    assert [p["buffers"] for p in got["points"]] == [p["buffers"] for p in server["sweep"]["points"]]
    assert httpx.get(server["base"] + "/api/sweeps/0000", timeout=30).status_code == 404
    assert httpx.get(server["base"] + "/api/sweeps/not-hex", timeout=30).status_code in (400, 422)


def test_sweep_page_charts_a_recorded_sweep_and_opens_a_point(server, page):
    sid = server["sweep"]["sweep"]
    page.goto(f"{server['base']}/sweep")
    page.click(f"#rec-list a[href='/sweep?id={sid}']")
    page.wait_for_selector("#rec-result[data-ready='1']", timeout=30000)
    assert f"id={sid}" in page.url
    lines = page.evaluate("() => document.getElementById('rec-chart').data"
                          ".filter(t => t.meta.kind === 'setting').map(t => [t.name, t.x, t.y])")
    assert lines == [["-fa=off", [128, 256, 512], [expected_bytes(c, 32, 2) for c in (128, 256, 512)]],
                     ["-fa=on", [128, 256, 512], [p["buffers"]["CPU"] for p in server["sweep"]["points"]
                                                  if p["values"]["-fa"] == "on"]]]
    # the stack for -fa=off: its families at the peak plus the rest add up to each point's buffer
    stack = page.evaluate("() => document.getElementById('rec-chart').data"
                          ".filter(t => t.meta.kind === 'family').map(t => [t.meta.family, t.y])")
    fams = dict((f, y) for f, y in stack)
    assert fams["kq"] == [4 * c * 32 * 2 for c in (128, 256, 512)]
    assert [sum(y[i] for _, y in stack) for i in range(3)] == lines[0][2]
    assert page.locator("#rec-table tbody tr").count() == 6
    assert "kq: 4·-c·32·2 B per tensor" in page.locator("#rec-laws").inner_text()
    # a click on the chart's -fa=off point at -c 256 opens its card
    box = page.evaluate("""() => {
      const gd = document.getElementById('rec-chart'), k = gd.data.findIndex(t => t.meta.kind === 'setting');
      const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.querySelector('.nsewdrag').getBoundingClientRect();
      return [r.left + xa.l2p(xa.c2l(gd.data[k].x[1])), r.top + ya.l2p(gd.data[k].y[1])];
    }""")
    page.mouse.click(*box)
    page.wait_for_selector("#rec-point:not([hidden])", timeout=10000)
    idx = int(page.get_attribute("#rec-result", "data-point"))
    point = server["sweep"]["points"][idx]
    assert point["values"] == {"-c": "256", "-fa": "off"}
    assert page.locator("#rec-table tbody tr.selected").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "sweep-recorded.png"), full_page=True)
    prev = next(p for p in server["sweep"]["points"] if p["values"] == {"-c": "128", "-fa": "off"})
    href = page.get_attribute("#rec-point a.rec-diff-previous", "href")
    assert href == f"/diff?a={prev['trace']}%3A{prev['graph']}&b={point['trace']}%3A{point['graph']}"
    assert page.get_attribute("#rec-point a.rec-diff-next", "href").startswith(f"/diff?a={point['trace']}")
    page.click("#rec-open-trace")
    page.wait_for_url(f"**/traces/{point['trace']}?g={point['graph']}")
    page.wait_for_selector("#peak[data-ready='1']", timeout=30000)  # its peak: shapes from the recording
    assert "f32 [256, 32, 2]: 4·256·32·2 = 65,536 B" in page.locator("#peak").inner_text()
    # back, and a click on a table row selects that point too
    page.goto(f"{server['base']}/sweep?id={sid}")
    page.wait_for_selector("#rec-result[data-ready='1']", timeout=30000)
    page.locator("#rec-table tbody tr").nth(5).click()
    assert page.get_attribute("#rec-result", "data-point") == "5"
    assert "-c=512 -fa=on" in page.locator("#rec-point h3").inner_text()
