"""Import benchmark: a ~100 MB log made by repeating a real fixture log.

Prints the import time as a ratio to merely reading the file's lines in Python
(goal: at most 3x) and the importing process's peak RSS (goal: at most 400 MB).
Repeated copies are what the importer's memos are for (real logs repeat eval
graphs); `--vary` renames the tensors in every copy, so no graph repeats and
every line is new: the importer's cold path.
`--log PATH` imports one log as it is instead (e.g. a real long generation run; .xz/.gz/.zst
are decompressed first, outside the timing). `--json PATH` writes the figures (bench/figures.py).
`--warm` leaves the modules an import loads on first use (numpy, the sources, the compiled fast
path) out of the timing. ALLOCTRACE_PURE_PYTHON=1 times the Python path alone.
Usage: python bench/bench_import.py [--mb 100] [--fixture PATH] [--vary] [--log PATH] [--warm] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import shutil
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import Figure, add_option, at_most, write

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("ALLOCTRACE_FIXTURES", ROOT / "tests" / "data" / "ggml-real"))
DEFAULT = FIXTURES / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"


def build(src: Path, dst: Path, mb: int, vary: bool = False) -> int:
    data = src.read_bytes()
    reps = max(1, (mb << 20) // len(data))
    with open(dst, "wb") as f:
        for i in range(reps):
            f.write(data.replace(b"node_", b"n%d_" % i).replace(b"leaf_", b"l%d_" % i) if vary else data)
    return reps


def unpack(src: Path, dst: Path) -> None:
    """A log decompressed by its suffix (plain files are copied)."""
    import gzip
    import lzma
    import zstandard
    opener = {".xz": lzma.open, ".gz": gzip.open,
              ".zst": lambda p: zstandard.ZstdDecompressor().stream_reader(open(p, "rb"))}.get(src.suffix, open)
    with opener(src, "rb") as f, open(dst, "wb") as out:
        shutil.copyfileobj(f, out, 1 << 20)


def read_lines(path: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, lines) to read the file's lines in Python."""
    t, c = time.perf_counter(), time.process_time()
    n = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for _ in f:
            n += 1
    return time.perf_counter() - t, time.process_time() - c, n


READER = "import sys\nwith open(sys.argv[1], encoding='utf-8', errors='replace') as f:\n    for _ in f:\n        pass\n"


def whole_processes(log: Path, store: Path) -> tuple[float, float]:
    """(wall seconds of `alloctrace import LOG`, of a python process that only reads LOG's lines)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", READER, str(log)], check=True)
    t_read = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "alloctrace", "import", "--store", str(store), str(log)], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t, t_read


def cpu_with_children() -> float:
    """CPU seconds of this process and of its children that ended (an import reads each file in a child)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def child(path: str, store: str, warm: bool = False):
    from alloctrace.traces import import_paths
    from alloctrace.traces.store.store import open_store

    s = open_store(store)
    if warm:  # load what an import loads on first use (numpy, the sources, the built fast path), untimed
        from alloctrace.traces.sources import registered
        from alloctrace.traces.sources.ggml_log import fastlog
        registered()
        fastlog.library()
    t, c = time.perf_counter(), cpu_with_children()
    [tid] = import_paths(s, [path])
    dt, dc = time.perf_counter() - t, cpu_with_children() - c
    graphs = s.summary(tid)["graphs"]
    print(dt, dc, len(graphs), sum(g["n_events"] for g in graphs), sum(1 for g in graphs if g["consistent"]))


def bench_large_graph(store_dir: Path, n: int = 1_000_000):
    """Time loading one graph of n events back from the store."""
    from alloctrace.allocator.events import Event
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    from alloctrace.traces.store.store import open_store

    s = open_store(store_dir)
    ev = [Event("alloc" if i % 2 else "free", tensor=f"node_{i % 5000}", size=4096 + (i % 64) * 32,
                offset=(i * 32) % (1 << 30), block=i % 7, n_free=i % 100) for i in range(n)]
    t = time.perf_counter()
    tid = s.add_trace(TraceMeta("big", "bench", "ggml-head"), [GraphRecord(0, "reserve", ev)])
    t_add = time.perf_counter() - t
    t = time.perf_counter()
    cols = s.columns(tid, 0)
    t_cols = time.perf_counter() - t
    t = time.perf_counter()
    back = s.events(tid, 0)
    t_events = time.perf_counter() - t
    assert len(cols["i"]) == n and len(back) == n
    print(f"{n:,}-event graph: add {t_add:.2f} s, columns() {t_cols:.3f} s, events() {t_events:.2f} s")
    return [Figure(f"store: add a {n:,}-event graph", round(t_add, 3), "s"),
            Figure(f"store: columns() of a {n:,}-event graph", round(t_cols, 3), "s"),
            Figure(f"store: events() of a {n:,}-event graph", round(t_events, 3), "s")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--fixture", type=Path, default=DEFAULT)
    ap.add_argument("--vary", action="store_true", help="rename tensors in every copy (nothing repeats)")
    ap.add_argument("--log", type=Path, help="import this log as it is (no copies)")
    ap.add_argument("--no-large-graph", action="store_true", help="skip the 1M-event store round trip")
    ap.add_argument("--warm", action="store_true",
                    help="time the import after the modules it loads on first use are loaded (a server's steady state)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    add_option(ap)
    a = ap.parse_args()
    if a.child:
        return child(*a.child, warm=a.warm)
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "big.log"
        if a.log:
            unpack(a.log, log)
            what = f"{a.log.name}"
        else:
            reps = build(a.fixture, log, a.mb, a.vary)
            what = f"{a.fixture.name} x {reps}{' (renamed per copy)' if a.vary else ''}"
        size = log.stat().st_size
        read_lines(log)  # warm the page cache
        t_read, c_read, n_lines = read_lines(log)
        out = subprocess.run([sys.executable, __file__, "--child", str(log), str(Path(d) / "store")] +
                             (["--warm"] if a.warm else []),
                             capture_output=True, text=True, check=True).stdout.split()
        t_import, c_import = float(out[0]), float(out[1])
        n_graphs, n_events, n_consistent = int(out[2]), int(out[3]), int(out[4])
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        db_mb = sum(p.stat().st_size for p in (Path(d) / "store").iterdir()) / 1e6
        t_proc, t_proc_read = whole_processes(log, Path(d) / "store2")
    goal = 5 if a.vary else 3
    print(f"log: {what} = {size / 1e6:.1f} MB, {n_lines:,} lines")
    print(f"graphs: {n_graphs:,} ({n_consistent:,} consistent), events: {n_events:,}, store: {db_mb:.1f} MB")
    print(f"wall: read lines {t_read:.2f} s, import {t_import:.2f} s, ratio {t_import / t_read:.1f}x (goal <= {goal}x)")
    print(f"CPU:  read lines {c_read:.2f} s, import {c_import:.2f} s, ratio {c_import / c_read:.1f}x; "
          f"{c_import / n_lines * 1e6:.1f} us per line")
    print(f"peak RSS of the importing process: {rss_mb:.0f} MB (goal <= 400 MB)")
    print(f"whole processes: `alloctrace import` {t_proc:.2f} s, a python process reading the lines "
          f"{t_proc_read:.2f} s, ratio {t_proc / t_proc_read:.1f}x")
    case = ("real log" if a.log else "nothing repeats" if a.vary else "repeated log") + \
        f" ({what}, {size / 1e6:.0f} MB, {n_graphs:,} graphs)"
    figures = [
        at_most(f"import {case}: wall", t_import / t_read, "x", goal,
                f"reading its lines in Python, in-process: {t_read:.3f} s (import {t_import:.2f} s)"),
        Figure(f"import {case}: CPU", round(c_import / c_read, 2), "x", "",
               None, f"CPU to read its lines: {c_read:.3f} s (import {c_import:.2f} s)"),
        at_most(f"import {case}: peak RSS", rss_mb, "MB", 400),
        Figure(f"import {case}: whole `alloctrace import` process", round(t_proc / t_proc_read, 2), "x",
               baseline=f"a python process reading its lines: {t_proc_read:.2f} s (import {t_proc:.2f} s)"),
    ]
    if not a.no_large_graph:
        with tempfile.TemporaryDirectory() as d:
            figures += bench_large_graph(Path(d))
    write(a.json, figures)


if __name__ == "__main__":
    main()
