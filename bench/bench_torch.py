"""PyTorch snapshot import benchmark: a ~1M-entry snapshot made by repeating a real fixture's trace.

Each repetition copies every entry dict and its frame list (as torch writes them: distinct entries and
lists, shared frame dicts), shifting the timestamps, so the pickle looks like one long recording.
Prints, each measured in a fresh process: plain `pickle.load` (the floor), alloctrace's restricted
read into columns, and the full import into a store; wall time and peak RSS, and their ratios to
pickle.load (goals: time <= 3x, RSS <= 1.5x). CPU seconds (whole process, interpreter start
included) are the steadier figure on a busy machine.
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
    "restricted read": ("from alloctrace.traces.torch.source import read_snapshot; "
                        "x = read_snapshot(open(P, 'rb'), filename='bench.pickle')"),
    "import into a store": ("import tempfile; from alloctrace.traces.store import open_store; "
                            "from alloctrace.traces import import_paths; "
                            "import_paths(open_store(tempfile.mkdtemp()), [P])"),
}


def measure(code: str, path: Path) -> dict:
    prog = (f"import resource, time, gc, json; P = {str(path)!r}; t = time.perf_counter(); {code}; "
            "w = time.perf_counter() - t; u = resource.getrusage(resource.RUSAGE_SELF); "
            "print(json.dumps({'wall_s': w, 'cpu_s': u.ru_utime + u.ru_stime, 'rss_mb': u.ru_maxrss / 1024}))")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def first_picture(path: Path) -> None:
    """Import the snapshot, serve it, and time Chromium from opening /torch?id= to the drawn timeline."""
    import socket
    import threading
    import time

    import uvicorn
    from playwright.sync_api import sync_playwright

    from alloctrace.server.app import create_app
    from alloctrace.traces.store import open_store
    from alloctrace.traces import import_paths

    with tempfile.TemporaryDirectory() as store_dir:
        [tid] = import_paths(open_store(store_dir), [path])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = uvicorn.Server(uvicorn.Config(create_app(store_dir=store_dir), host="127.0.0.1", port=port,
                                            log_level="warning"))
        threading.Thread(target=srv.run, daemon=True).start()
        while not srv.started:
            time.sleep(0.05)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                  args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            for run in ("cold (server builds its caches)", "warm"):
                page = b.new_page(viewport={"width": 1400, "height": 1000})
                t = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/torch?id={tid}")
                page.wait_for_selector("#timeline[data-ready='1']", timeout=120_000)
                print(f"{'first picture, ' + run:>44}: {time.perf_counter() - t:5.2f} s")
                page.close()
            b.close()
        srv.should_exit = True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--fixture", type=Path, default=DEFAULT)
    ap.add_argument("--deepen", type=int, default=1,
                    help="repeat each stack's frames this many times (3 gives ~20 frames per entry, like a real "
                         "1M-entry, 145 MB snapshot)")
    ap.add_argument("--browser", action="store_true", help="also time the dashboard's first picture in Chromium")
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
            first_picture(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
