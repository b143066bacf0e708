"""Screenshots of every dashboard page for docs/dashboard.md, at a desktop and a phone width.

    python docs/screenshots.py                 # a fresh store of the repository's examples -> docs/images/
    python docs/screenshots.py --out DIR --store DIR

The store holds the legacy harness log (its measure and failing eval graphs), the shipped 302-graph
gpt-2 log (a long run), a PyTorch snapshot that ran out of memory, and a fit and a `plan --vary` search
(tests/preflight_results.py) for the pre-flight page. Each page is opened in Chromium
(/usr/bin/chromium through Playwright), waited for until its charts are drawn, and saved as
`PAGE-desktop.png` (1440x900) and `PAGE-phone.png` (390x844). It also prints, per page and width, whether
the page is wider than the window (it must not be).
"""
from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
LEGACY = DATA / "ggml-real" / "v2023-08-16-legacy" / "harness_plain.AT.log"
LONG = DATA / "ggml-real" / "many-graphs" / "gpt-2_117M_many.2023-08-28.AT.log.xz"
TORCH = DATA / "torch" / "oom.pickle.gz"
VIEWPORTS = {"desktop": (1440, 900), "phone": (390, 844)}
CHROMIUM = "/usr/bin/chromium"


def build_store(path: Path) -> dict:
    """The example store; the ids of its traces by role."""
    from alloctrace.traces import import_paths
    from alloctrace.traces.store.store import open_store

    store = open_store(path)
    try:
        ids = {}
        for key, file, name in (("legacy", LEGACY, "legacy harness (2023-08-16, fails)"),
                                ("long", LONG, "gpt-2 117M, 300 tokens"), ("torch", TORCH, "PyTorch OOM")):
            [ids[key]] = import_paths(store, [file], name=name)
    finally:
        store.close()
    ids.update(preflight_results(path))
    return ids


def preflight_results(path: Path) -> dict:
    """A fit of a real ggml program and a `plan --vary` search of a real PyTorch step (tests/preflight_results.py),
    for the pre-flight page; none when ggml-python or torch is missing."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import preflight_results
    except ImportError as e:  # ggml-python missing: the page is shot without them
        print(f"  (no pre-flight examples: {e})", file=sys.stderr)
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        got = preflight_results.build(path, Path(tmp))
    return {"fit": got["fit"]["sweep"], **({"plan": got["plan"]["plan"]} if got["plan"] else {})}


def pages(ids: dict) -> dict[str, str]:
    """Page name -> path: every page of the dashboard with real data, and a stale link's error page."""
    from alloctrace.server.app import PAGES

    shown = {"home": "/", "trace": f"/traces/{ids['legacy']}", "trace-graph0": f"/traces/{ids['legacy']}?g=0", "trace-long": f"/traces/{ids['long']}?g=5",
            "diff": f"/diff?a={ids['legacy']}:0&b={ids['legacy']}:1", "torch-list": "/torch",
            "torch": f"/torch?id={ids['torch']}", "whatif": f"/whatif?trace={ids['torch']}&device=0",
            "sweep": "/sweep", "replay": "/replay", "not-found": "/traces/0000dead"}
    for key in ("fit", "plan"):
        if key in ids:
            shown[f"preflight-{key}"] = f"/preflight?id={ids[key]}"
    for route in PAGES:  # a page added later is shot too, as it opens without parameters
        if route not in shown.values():
            shown[route.strip("/").replace("/", "-")] = route
    return shown


READY = """() => {
  const busy = document.querySelector('[aria-busy="true"]');
  const charts = [...document.querySelectorAll('.chart:not([hidden])')].filter((c) => c.offsetParent !== null);
  const drawn = charts.every((c) => c.dataset.ready === '1' || c.querySelector('.main-svg') || c.querySelector('.error, .empty'));
  return !busy && drawn && (document.body.dataset.loaded !== undefined || document.body.dataset.page !== 'torch');
}"""


def settle(page, timeout_ms: int = 30000):
    """Wait until no panel is loading and every visible chart is drawn (or the time is up)."""
    try:
        page.wait_for_function(READY, timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - a page that never settles is still shot, and reported
        print(f"  (not settled: {page.url})", file=sys.stderr)
    page.wait_for_timeout(300)


def overflow(page) -> int:
    """How many CSS pixels the page is wider than its window (0: it fits)."""
    return page.evaluate("Math.max(0, document.documentElement.scrollWidth - window.innerWidth)")


def serve(store_dir: Path):
    import uvicorn

    from alloctrace.server.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(store_dir=store_dir), host="127.0.0.1", port=port,
                                        log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{port}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    ap.add_argument("--store", type=Path, help="an existing store to build the examples into (default: a fresh one)")
    ap.add_argument("--only", help="comma-separated page names")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        store_dir = args.store or Path(tmp) / "store"
        ids = build_store(store_dir)
        srv, base = serve(store_dir)
        args.out.mkdir(parents=True, exist_ok=True)
        wanted = set(args.only.split(",")) if args.only else None
        bad = 0
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
            for width_name, (w, h) in VIEWPORTS.items():
                ctx = browser.new_context(viewport={"width": w, "height": h})
                for name, path in pages(ids).items():
                    if wanted and name not in wanted:
                        continue
                    page = ctx.new_page()
                    page.goto(base + path)
                    settle(page)
                    wide = overflow(page)
                    bad += wide > 0
                    page.screenshot(path=str(args.out / f"{name}-{width_name}.png"), full_page=True)
                    print(f"{name:11} {width_name:8} {'fits' if not wide else f'{wide} px too wide'}")
                    page.close()
                ctx.close()
            browser.close()
        srv.should_exit = True
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
