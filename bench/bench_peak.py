"""The plain-Python peak (traces/explain/peak_fast.py) against numpy's ggml_peak on recorded llama.cpp graphs:
per graph in one process, and as a sweep's worker pays it (a fresh Python: imports plus one graph's peak).
Goal: the fast path is never slower than the reference.

    python bench/bench_peak.py [--repeat N] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import Figure, add_option, at_most, write

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
RECORDINGS = ["compare/tiny-llama-fa-on.atrec.gz", "record/cuda/ngl99-faoff-c1024.atrec.xz",
              "record/moe/qwen3moe-fa-off-c512.atrec.xz"]
FRESH = """import sys, pickle, time
t = time.perf_counter()
events = pickle.load(open(sys.argv[1], "rb"))
if sys.argv[2] == "fast":
    from alloctrace.traces.explain.peak_fast import peak_of_events as peak
else:
    from alloctrace.traces.explain.peak import ggml_peak as peak
peak(events).to_json()
print(time.perf_counter() - t)
"""


def graphs() -> list:
    from alloctrace.traces.sources import import_paths
    from alloctrace.traces.store.store import open_store

    with tempfile.TemporaryDirectory() as tmp:
        s = open_store(Path(tmp))
        try:
            return [s.events(tid, row["index"]) for tid in import_paths(s, [DATA / r for r in RECORDINGS])
                    for row in s.summary(tid)["graphs"]]
        finally:
            s.close()


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    add_option(ap)
    a = ap.parse_args()
    from alloctrace.traces.explain.peak import ggml_peak
    from alloctrace.traces.explain.peak_fast import ggml_peak_events

    gs = graphs()
    n_events = sum(map(len, gs))
    ref = best(lambda: [ggml_peak(g).to_json() for g in gs], a.repeat)
    fast = best(lambda: [ggml_peak_events(g).to_json() for g in gs], a.repeat)
    print(f"{len(gs)} recorded graphs, {n_events} events: ggml_peak {ref * 1e3:.1f} ms, "
          f"peak_fast {fast * 1e3:.1f} ms, ratio {fast / ref:.2f}x")
    import pickle

    biggest = max(gs, key=len)
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        pickle.dump(biggest, f)
        f.flush()
        # as installed: compiled modules kept (PYTHONDONTWRITEBYTECODE would recompile every run); one warm-up each
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        run = lambda how: float(subprocess.run([sys.executable, "-c", FRESH, f.name, how], capture_output=True,  # noqa: E731
                                               text=True, check=True, env=env).stdout)
        cold = {how: statistics.median([run(how) for _ in range(a.repeat + 1)][1:]) for how in ("fast", "numpy")}
    print(f"fresh process, one graph of {len(biggest)} events (imports + peak): ggml_peak {cold['numpy'] * 1e3:.1f} ms,"
          f" peak_of_events {cold['fast'] * 1e3:.1f} ms, ratio {cold['fast'] / cold['numpy']:.2f}x")
    write(a.json, [at_most("peak_fast vs ggml_peak on recorded graphs (one process)", fast / ref, "x", 1.0,
                           f"ggml_peak over {len(gs)} graphs: {ref * 1e3:.1f} ms"),
                   at_most("peak_of_events vs ggml_peak in a fresh process (imports + one graph)",
                           cold["fast"] / cold["numpy"], "x", 1.0, f"ggml_peak: {cold['numpy'] * 1e3:.1f} ms")])


if __name__ == "__main__":
    main()
