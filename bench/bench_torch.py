"""PyTorch snapshot import benchmark: a ~1M-entry snapshot made by repeating a real fixture's trace.

Each repetition copies every entry dict and its frame list (as torch writes them: distinct entries and
lists, shared frame dicts), shifting the timestamps, so the pickle looks like one long recording.
Prints, each measured in a fresh process: plain `pickle.load` (the floor), alloctrace's restricted
read into columns, and the full import into a store; wall time and peak RSS, and their ratios to
pickle.load (goals: time <= 3x, RSS <= 1.5x). CPU seconds (whole process, interpreter start
included) are the steadier figure on a busy machine. `--browser` also opens the snapshot's page in Chromium.
Usage: python bench/bench_torch.py [--entries 1000000] [--deepen 3] [--fixture tests/data/torch/gpt2_train_bs8.pickle.gz]
"""
from __future__ import annotations

import argparse
import gzip
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "tests" / "data" / "torch" / "gpt2_train_bs8.pickle.gz"


def build(src: Path, dst: Path, entries: int, deepen: int = 1) -> int:
    snap = pickle.loads(gzip.decompress(src.read_bytes()))  # our own fixture: trusted
    trace = snap["device_traces"][0]
    span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
    reps = max(1, -(-entries // len(trace)))
    out = []
    for r in range(reps):
        for e in trace:
            c = dict(e)
            c["time_us"] = e["time_us"] + r * span
            if "frames" in e:
                c["frames"] = list(e["frames"]) * deepen
            out.append(c)
    snap["device_traces"][0] = out[:entries]
    with open(dst, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return len(snap["device_traces"][0])


PROBES = {
    "pickle.load": "import pickle; f = open(P, 'rb'); x = pickle.load(f)",
    "restricted read": ("from alloctrace.traces.sources.torch.source import read_snapshot; "
                        "x = read_snapshot(open(P, 'rb'), filename='bench.pickle')"),
    "import into a store": ("import tempfile; from alloctrace.traces.store.store import open_store; "
                            "from alloctrace.traces import import_paths; "
                            "import_paths(open_store(tempfile.mkdtemp()), [P])"),
}


def measure(code: str, path: Path) -> dict:
    prog = (f"import resource, time, gc, json; P = {str(path)!r}; t = time.perf_counter(); {code}; "
            "w = time.perf_counter() - t; u = resource.getrusage(resource.RUSAGE_SELF); "
            "print(json.dumps({'wall_s': w, 'cpu_s': u.ru_utime + u.ru_stime, 'rss_mb': u.ru_maxrss / 1024}))")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def first_picture(path: Path, runs: int = 3, web_dir: Path | None = None) -> None:
    """Import the snapshot, serve it, and time Chromium from opening /torch?id= to the timeline's first picture
    (the canvas drawn before Plotly.js runs) and to the interactive chart, as ratios to a page on the same server
    that only loads Plotly.js (bench_web.py's baseline), each in a fresh browser context: one round on a cold
    server, reported apart, then the medians of `runs` rounds on a warm one."""
    import statistics

    from playwright.sync_api import sync_playwright

    from alloctrace.traces.store.store import open_store
    from alloctrace.traces import import_paths
    from bench_web import ARGS, CHROMIUM, plotly_alone_ms, serve

    with tempfile.TemporaryDirectory() as store_dir:
        [tid] = import_paths(open_store(store_dir), [path])
        srv, base = serve(Path(store_dir), web_dir)  # with bench_web's Plotly.js-alone page
        rows = []
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            for run in range(runs + 1):  # run 0: the server builds the snapshot's caches (reported apart)
                ctx = b.new_context(viewport={"width": 1400, "height": 1000})
                alone = plotly_alone_ms(ctx.new_page(), base)
                ctx.close()
                ctx = b.new_context(viewport={"width": 1400, "height": 1000})
                page = ctx.new_page()
                page.goto(f"{base}/torch?id={tid}", wait_until="commit")
                page.wait_for_selector("#timeline[data-ready='1']", state="attached", timeout=120_000)
                ready = page.evaluate("performance.now()")
                at = page.get_attribute("#timeline", "data-picture-at")
                picture = float(at) if at else ready
                if run:
                    rows.append((alone, picture, ready))
                label = "cold server (it builds its caches)" if run == 0 else f"run {run}"
                print(f"dashboard {label}: Plotly.js alone {alone:,.0f} ms; first picture {picture:,.0f} ms, "
                      f"interactive {ready:,.0f} ms")
                ctx.close()
            b.close()
        srv.should_exit = True
    med = statistics.median
    print(f"dashboard, empty browser cache, warm server, median of {runs}: first picture "
          f"{med(r[1] / r[0] for r in rows):.2f}x, interactive {med(r[2] / r[0] for r in rows):.2f}x Plotly.js alone ({med(r[0] for r in rows):,.0f} ms)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--fixture", type=Path, default=DEFAULT)
    ap.add_argument("--deepen", type=int, default=1,
                    help="repeat each stack's frames this many times (3 gives ~20 frames per entry, like a real "
                         "1M-entry, 145 MB snapshot)")
    ap.add_argument("--browser", action="store_true", help="also time the dashboard's first picture and interactive "
                    "timeline in Chromium, as ratios to Plotly.js alone loading")
    ap.add_argument("--web", type=Path, help="with --browser: serve the dashboard from this folder (e.g. an older "
                    "checkout's web/, to compare)")
    ap.add_argument("--keep", type=Path, help="write the synthetic pickle here and keep it")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "big.pickle"
        n = build(args.fixture, path, args.entries, args.deepen)
        size = path.stat().st_size
        print(f"synthetic snapshot: {n:,} entries, {size / 1e6:.0f} MB ({args.fixture.name} repeated)")
        base = None
        for label, code in PROBES.items():
            m = measure(code, path)
            base = base or m
            print(f"{label:>20}: {m['wall_s']:6.2f} s wall ({m['wall_s'] / base['wall_s']:.2f}x), "
                  f"{m['cpu_s']:6.2f} s CPU ({m['cpu_s'] / base['cpu_s']:.2f}x)   "
                  f"peak RSS {m['rss_mb']:7.0f} MB ({m['rss_mb'] / base['rss_mb']:.2f}x)")
        if args.browser:
            first_picture(path, web_dir=args.web)
    return 0


if __name__ == "__main__":
    sys.exit(main())
