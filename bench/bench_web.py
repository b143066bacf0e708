"""First render of a 1M-event trace in the dashboard: time until the memory map is interactive.

Stores a synthetic 1,000,000-event graph directly through the store API, serves it with the
real server on a loopback port, opens its trace view in headless Chromium, waits for the map's
`data-ready="1"` attribute (set after Plotly's first render) and reads the page's clock then
(`performance.now()`: milliseconds since navigation started). Runs cold (server caches empty) and warm, then
times a zoom (relayout -> windowed fetch -> redraw). Goal: interactive in under 2 s.

    python bench/bench_web.py [--events 1000000] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import random
import socket
import tempfile
import threading
import time
from pathlib import Path

import uvicorn

from alloctrace.allocator.events import Event
from alloctrace.server.app import create_app
from alloctrace.traces.schema import GraphRecord, TraceMeta
from alloctrace.traces.store import open_store
from figures import add_option, at_most, write

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


def serve(store_dir: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(store_dir=store_dir), host="127.0.0.1", port=port,
                                        log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{port}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
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
        srv, base = serve(Path(tmp))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            context = browser.new_context(viewport={"width": 1400, "height": 1000})  # one user, one cache
            blank = browser.new_page()
            blank.goto(f"{base}/api/presets")
            plotly_ms = blank.evaluate("""() => new Promise(done => { const t = performance.now();
                const s = document.createElement('script'); s.src = '/vendor/plotly.min.js';
                s.onload = () => done(performance.now() - t); document.head.append(s); })""")
            blank.close()
            print(f"baseline: loading and running Plotly.js alone takes {plotly_ms:,.0f} ms on this machine")
            for run in range(args.runs):
                page = context.new_page()
                page.goto(f"{base}/traces/{tid}", wait_until="commit")
                page.wait_for_selector("#map[data-ready='1']", state="attached", timeout=120000)
                ready = page.evaluate("performance.now()")
                parsed = page.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
                shapes = page.evaluate("""document.getElementById('map').data.filter(t => t.fill === 'toself')
                    .reduce((n, t) => n + t.x.filter(v => v === null).length, 0)""")
                label = "first visit: empty browser cache, cold server" if run == 0 else "repeat visit"
                figures.append(at_most(f"dashboard: map interactive, run {run + 1} ({label}), {args.events:,} events",
                                       ready / plotly_ms,
                                       "x", 1.25, f"Plotly.js alone loading in the same browser: {plotly_ms:,.0f} ms "
                                       f"(map: {ready:,.0f} ms)"))
                print(f"run {run + 1} ({label}): map interactive {ready:,.0f} ms after navigation; "
                      f"scripts parsed (Plotly.js) at {parsed:,.0f} ms, map drawn {ready - parsed:,.0f} ms later "
                      f"({shapes:,} rectangles)")
                if run == args.runs - 1:
                    t = time.perf_counter()
                    page.evaluate("Plotly.relayout('map', {'xaxis.range': [400000, 401000]})")
                    page.wait_for_function("Number(document.getElementById('map').dataset.fetches || 0) >= 1",
                                           timeout=60000)
                    print(f"zoom to 1,000 events: redrawn with detail in {(time.perf_counter() - t) * 1000:,.0f} ms "
                          f"(includes a 120 ms debounce)")
                page.close()
            context.close()
            browser.close()
        srv.should_exit = True
    print(f"goal: interactive in under 2,000 ms; load average during the run: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    write(args.json, figures)


if __name__ == "__main__":
    main()
