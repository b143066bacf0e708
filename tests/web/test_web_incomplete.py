"""The dashboard marks a graph whose log ends inside its walk (a cut log) as incomplete,
in a real headless Chromium against a real uvicorn server."""
from pathlib import Path

import pytest

from alloctrace.traces.sources import import_file
from alloctrace.traces.store.store import open_store
from conftest import live_server

playwright_api = pytest.importorskip("playwright.sync_api")


GPT2 = Path(__file__).parents[1] / "data" / "hostile" / "gpt-2_tiny_short.AT.log"


def test_cut_log_shows_incomplete_on_home_and_trace_pages(tmp_path, page):
    cut = tmp_path / "cut.log"
    cut.write_bytes(GPT2.read_bytes()[:40_000])
    store = open_store(tmp_path / "s")
    [summary] = import_file(store, cut)
    tid = summary["id"]
    last = store.summary(tid)["graphs"][-1]["index"]
    store.close()
    with live_server(tmp_path / "s") as base:
        page.goto(base + "/")
        page.wait_for_selector("#trace-table .incomplete")
        assert f"incomplete graph {last}" in page.inner_text("#trace-table")
        page.goto(f"{base}/traces/{tid}?g={last}")
        page.wait_for_selector("#facts .incomplete")
        assert "incomplete" in page.inner_text("#graph-bar")
        page.goto(f"{base}/traces/{tid}?g=0")
        page.wait_for_selector("#graph-bar a")
        assert page.query_selector("#facts .incomplete") is None  # a complete graph says nothing
