"""First picture and first interactive map of a 1M-event trace in the dashboard, against Plotly.js alone.

Stores a synthetic 1,000,000-event graph directly through the store API, serves it with the real server on
a loopback port and opens its trace view in headless Chromium. Two times per visit, read from the page's
clock (`performance.now()`: milliseconds since navigation started):
- first picture: the map's real data on screen (`data-picture-at`, set once the canvas picture drawn before
  Plotly.js runs has been painted; a page that draws with Plotly.js first has its first picture when ready);
- interactive: Plotly's chart drawn (`data-ready="1"`, what the tests wait for).
Baseline, in the same run and browser: a page on the same server that only loads the same Plotly.js URL
(`/bench/plotly-alone`), from navigation to `window.Plotly`; cold (empty cache) beside a first visit, warm
beside a repeat visit. Each run opens fresh browser contexts. A first round on a cold server (it builds the
graph's lifetimes and tile pyramid) is reported on its own; then `--runs` rounds on a warm server, whose medians
of the ratios are the figures. Last, a zoom is timed (relayout -> windowed fetch -> redraw).

    python bench/bench_web.py [--events 1000000] [--runs 5] [--web OLD_CHECKOUT/web]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import socket
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from fastapi.responses import HTMLResponse

from alloctrace.allocator.events import Event
from alloctrace.server.app import create_app
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import open_store
from figures import Figure, add_option, at_most, write

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]
OPS = ["MUL_MAT", "ADD", "MUL", "NORM", "ROPE", "SOFT_MAX", "CPY", "UNARY"]


def synthetic_events(n_events: int, slots: int = 96, slot_bytes: int = 1 << 20, seed: int = 7) -> list[Event]:
    """alloc / exec / free / step groups over a ring of slots: a tensor lives `slots` groups."""
    rng = random.Random(seed)
    events, live, k = [Event("graph")], {}, 0
    while len(events) < n_events:
        slot = k % slots
        if slot in live:
            name, off, size = live.pop(slot)
            events.append(Event("free", tensor=name, size=size, offset=off, n_free=1 + len(live) % 7,
                                largest_free=slot_bytes * (1 + slot % 5), total_free=slot_bytes * (slots - len(live))))
        size = rng.randrange(1, slot_bytes // 256) * 256
        off = slot * slot_bytes
        name = f"t{k}"
        op = OPS[k % len(OPS)]
        live[slot] = (name, off, size)
        events.append(Event("alloc", tensor=name, op=op, size=size, offset=off, block=slot % 4,
                            n_free=1 + len(live) % 7, largest_free=slot_bytes * (1 + slot % 5),
                            total_free=slot_bytes * (slots - len(live))))
        events.append(Event("exec", tensor=name, op=op, node=k))
        events.append(Event("step", node=k))
        k += 1
    return events[:n_events]


def plotly_alone_page(app) -> None:
    """/bench/plotly-alone: a page that loads only Plotly.js, from the URL the dashboard's pages use."""
    html = (f'<!doctype html><html><head><script src="/vendor/{app.state.assets.plotly_version}/plotly.min.js">'
            '</script></head><body><script>document.body.dataset.plotlyAt = performance.now();</script></body></html>')
    app.add_api_route("/bench/plotly-alone", lambda: HTMLResponse(html, headers={"Cache-Control": "no-cache"}),
                      methods=["GET"], include_in_schema=False)


def plotly_alone_ms(page, base: str) -> float:
    """Navigation to Plotly.js loaded and run, on the baseline page."""
    page.goto(f"{base}/bench/plotly-alone")
    return float(page.get_attribute("body", "data-plotly-at"))


def serve(store_dir: Path, web_dir: Path | None = None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(store_dir=store_dir, web_dir=web_dir)
    plotly_alone_page(app)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{port}"


def visit(page, url: str) -> dict:
    """Open the trace view; times of its first picture and of the interactive map, and what it drew."""
    page.goto(url, wait_until="commit")
    page.wait_for_selector("#map[data-ready='1']", state="attached", timeout=120000)
    ready = page.evaluate("performance.now()")  # as before: when the page answered after drawing
    at = page.evaluate("""() => { const d = document.getElementById('map').dataset;
        return [Number(d.pictureAt || 0), d.overview === '1'] }""")
    shapes = page.evaluate("""document.getElementById('map').data.filter(t => t.fill === 'toself')
        .reduce((n, t) => n + t.x.filter(v => v === null).length, 0)""")
    return {"picture": at[0] if at[1] else ready, "ready": ready, "overview": at[1], "shapes": shapes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--web", type=Path, help="serve the dashboard from this folder (e.g. an older checkout's web/, "
                    "to compare side by side)")
    add_option(ap)
    args = ap.parse_args()
    figures = []
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        t0 = time.perf_counter()
        events = synthetic_events(args.events)
        store = open_store(tmp)
        tid = store.add_trace(TraceMeta(name=f"synthetic {args.events:,} events", source="bench",
                                        generation="ggml-2023-08-16"),
                              [GraphRecord(0, "eval", events, max_size=96 << 20, buffer_size=96 << 20)])
        store.close()
        print(f"stored {len(events):,} events in {time.perf_counter() - t0:.1f} s (trace {tid})")
        srv, base = serve(Path(tmp), args.web)
        rows = []  # per run: baseline cold/warm, first visit, repeat visit
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for run in range(args.runs + 1):  # run 0: the server builds the graph's caches (reported apart)
                alone = browser.new_context(viewport={"width": 1400, "height": 1000})
                pg = alone.new_page()
                cold_ms, warm_ms = plotly_alone_ms(pg, base), plotly_alone_ms(pg, base)
                alone.close()
                context = browser.new_context(viewport={"width": 1400, "height": 1000})  # one user, one cache
                page = context.new_page()
                first = visit(page, f"{base}/traces/{tid}")
                again = visit(page, f"{base}/traces/{tid}")
                if run == 0:
                    figures.append(Figure("dashboard: first picture of the map on a cold server (it builds the "
                                          "graph's caches), empty browser cache", round(first["picture"] / cold_ms, 4),
                                          "x", baseline=f"Plotly.js alone loading: {cold_ms:,.0f} ms (map: first "
                                          f"picture {first['picture']:,.0f} ms, interactive {first['ready']:,.0f} ms)"))
                else:
                    rows.append((cold_ms, warm_ms, first, again))
                print(f"{'cold server' if run == 0 else f'run {run}'}: Plotly.js alone {cold_ms:,.0f} ms "
                      f"(cached {warm_ms:,.0f} ms); first visit: picture {first['picture']:,.0f} ms, interactive "
                      f"{first['ready']:,.0f} ms; repeat visit: picture {again['picture']:,.0f} ms, interactive "
                      f"{again['ready']:,.0f} ms ({first['shapes']:,} rectangles"
                      f"{', canvas picture first' if first['overview'] else ''})")
                if run == args.runs:
                    t = time.perf_counter()
                    page.evaluate("Plotly.relayout('map', {'xaxis.range': [400000, 401000]})")
                    page.wait_for_function("Number(document.getElementById('map').dataset.fetches || 0) >= 1",
                                           timeout=60000)
                    print(f"zoom to 1,000 events: redrawn with detail in {(time.perf_counter() - t) * 1000:,.0f} ms "
                          f"(includes a 120 ms debounce)")
                context.close()
            browser.close()
        srv.should_exit = True
    med = statistics.median
    for label, col, base_col in (("first visit (empty browser cache)", 2, 0), ("repeat visit (browser cache)", 3, 1)):
        base_ms = med(r[base_col] for r in rows)
        for what, goal in (("picture", 1.25), ("ready", None)):
            ratio = med(r[col][what] / r[base_col] for r in rows)
            name = "first picture" if what == "picture" else "interactive"
            runs = f"{len(rows)} run{'s' if len(rows) != 1 else ''}"
            text = f"dashboard: {name} of a {args.events:,}-event map, {label}, median of {runs}"
            baseline = (f"Plotly.js alone loading in the same browser run: median {base_ms:,.0f} ms "
                        f"(map {name}: median {med(r[col][what] for r in rows):,.0f} ms)")
            figures.append(at_most(text, ratio, "x", goal, baseline) if goal else
                           Figure(text, round(ratio, 4), "x", baseline=baseline))
            print(f"{text}: {ratio:.2f}x ({baseline})")
    print(f"goal: first picture <= 1.25x Plotly.js alone; load average during the run: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    write(args.json, figures)


if __name__ == "__main__":
    main()
