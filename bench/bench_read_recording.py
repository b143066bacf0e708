"""Reading one recorded dry run (`RecordingSource.read`, as a sweep reads each point) on the compiled replay of
its reserves against the Python path, side by side in one process: fastest and median of N reads each.

    python bench/bench_read_recording.py [RECORDING[.xz|.gz]] [--reads N] [--json PATH]

RECORDING defaults to tests/data/record/fit/tiny-llama-c4096-faoff.atrec.xz (the tiny model's dry run at -c
4096: one reserve_n_size, 862 events). `alloctrace record -o r.atrec -- llama-fit-params -m MODEL -v` makes one
of any model (bench/sparse_gguf.py writes a GGUF of a real model's shape without weights).
"""
from __future__ import annotations

import argparse
import gzip
import io
import lzma
import statistics
import sys
import time
from pathlib import Path

from alloctrace.traces.sources.record import plans_fast
from alloctrace.traces.sources.record.source import RecordingSource
from figures import add_option, at_most, write

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "record" / "fit" / "tiny-llama-c4096-faoff.atrec.xz"


def reads(data: bytes, n: int) -> tuple[float, float, int]:
    """(fastest, median) ms of n reads, and the events stored."""
    times, events = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        traces = RecordingSource().read(io.BytesIO(data), filename="x", name=None, events=[])
        times.append(time.perf_counter() - t0)
        events = sum(g.n_events for t in traces for g in t.graphs)
    return min(times) * 1e3, statistics.median(times) * 1e3, events


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording", nargs="?", default=str(DEFAULT))
    ap.add_argument("--reads", type=int, default=120)
    add_option(ap)
    a = ap.parse_args()
    raw = Path(a.recording).read_bytes()
    data = lzma.decompress(raw) if a.recording.endswith(".xz") else gzip.decompress(raw) \
        if a.recording.endswith(".gz") else raw
    if plans_fast.library() is None:
        sys.exit("the compiled replay is not built (no C compiler, or ALLOCTRACE_PURE_PYTHON=1)")
    fast = reads(data, a.reads)
    plans_fast._LIB[:] = [None]  # the Python path alone, as without a compiler
    pure = reads(data, a.reads)
    assert fast[2] == pure[2]
    print(f"{Path(a.recording).name}: {pure[2]:,} events")
    print(f"Python path  {pure[0]:.1f} ms fastest, {pure[1]:.1f} ms median of {a.reads}")
    print(f"compiled     {fast[0]:.1f} ms fastest, {fast[1]:.1f} ms median of {a.reads}")
    print(f"ratio {fast[1] / pure[1]:.2f}x (median)")
    write(a.json, [at_most("read of a recorded dry run, compiled vs Python (median)", fast[1] / pure[1], "x", 0.5,
                           f"the Python path: {pure[1]:.1f} ms")])


if __name__ == "__main__":
    main()
