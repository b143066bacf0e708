"""A PyTorch trace through its JSON Lines export and back, against the snapshot import it came from.

A long snapshot is made by repeating a real fixture's trace (bench_torch.build), imported into a store (the
baseline: the snapshot source, the same facts and model check), exported as JSON Lines, and that file imported
into a second store; each step timed in this process, best of --repeat. The stored rows of both stores are
compared (the same checksums), so the figures are of a round trip that kept every byte.
Goals: export <= 1x and import of the JSON Lines <= 3x the snapshot import.
Usage: python bench/bench_torch_jsonl.py [--entries 200000] [--repeat 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["ALLOCTRACE_IMPORT_IN_PROCESS"] = "1"  # the reading itself, not a child's start

from bench_torch import DEFAULT, build  # noqa: E402
from figures import Figure, add_option, at_most, write  # noqa: E402

from alloctrace.traces.export.torch_jsonl import write_jsonl  # noqa: E402
from alloctrace.traces.sources import import_file  # noqa: E402
from alloctrace.traces.store.store import open_store  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def checksums(store, tid: str) -> list[str]:
    with store._snapshot() as db:
        return [r[0] for r in db.execute("SELECT checksum FROM graphs WHERE trace_id=? ORDER BY idx", (tid,))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=2)
    add_option(ap)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-torch-jsonl-"))
    snap = tmp / "long.pickle"
    n = build(DEFAULT, snap, a.entries)
    src = open_store(tmp / "a")
    t_pickle, summaries = best(lambda: import_file(src, snap), a.repeat)
    tid = summaries[0]["id"]

    def export() -> str:
        buf = io.StringIO()
        write_jsonl(src, tid, buf)
        return buf.getvalue()

    t_export, text = best(export, a.repeat)
    data = text.encode()
    stores = []

    def reimport():
        stores.append(open_store(tmp / f"b{len(stores)}"))
        return import_file(stores[-1], io.BytesIO(data), filename="long.jsonl")

    t_import, back = best(reimport, a.repeat)
    assert back[0]["id"] == tid and checksums(stores[-1], tid) == checksums(src, tid), "the round trip lost bytes"
    base = f"snapshot import of {n:,} entries: {t_pickle:.2f} s"
    figures = [at_most("torch JSON Lines export / snapshot import", t_export / t_pickle, "x", 1, base),
               at_most("torch JSON Lines import / snapshot import", t_import / t_pickle, "x", 3, base),
               Figure("torch JSON Lines bytes per entry", round(len(data) / n, 1), "B")]
    for f in figures:
        print(f"{f.figure}: {f.text()}" + (f" ({f.baseline})" if f.baseline else ""))
    write(a.json, figures)


if __name__ == "__main__":
    main()
