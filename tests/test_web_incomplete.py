"""The dashboard marks a graph whose log ends inside its walk (a cut log) as incomplete,
in a real headless Chromium against a real uvicorn server."""
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from alloctrace.server.app import create_app
from alloctrace.traces.sources import import_file
from alloctrace.traces.store import open_store

playwright_api = pytest.importorskip("playwright.sync_api")

from test_web import free_port  # noqa: E402

GPT2 = Path(__file__).parent / "data" / "hostile" / "gpt-2_tiny_short.AT.log"


def test_cut_log_shows_incomplete_on_home_and_trace_pages(tmp_path, browser):
    cut = tmp_path / "cut.log"
    cut.write_bytes(GPT2.read_bytes()[:40_000])
    store = open_store(tmp_path / "s")
    [summary] = import_file(store, cut)
    tid = summary["id"]
    last = store.summary(tid)["graphs"][-1]["index"]
    store.close()
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(tmp_path / "s"), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        assert thread.is_alive()
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    try:
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(base + "/")
        page.wait_for_selector("#trace-table .incomplete")
        assert f"incomplete graph {last}" in page.inner_text("#trace-table")
        page.goto(f"{base}/traces/{tid}?g={last}")
        page.wait_for_selector("#facts .incomplete")
        assert "incomplete" in page.inner_text("#graph-bar")
        page.goto(f"{base}/traces/{tid}?g=0")
        page.wait_for_selector("#graph-bar a")
        assert page.query_selector("#facts .incomplete") is None  # a complete graph says nothing
        page.close()
        assert errors == []
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
