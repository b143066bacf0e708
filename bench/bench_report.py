"""The size of `alloctrace report` as the snapshot grows: a real fixture's trace repeated to N entries (as
bench_torch.py builds it), imported, then reported; against the fixture's own report in the same run.

    python bench/bench_report.py [--entries 1000000]
"""
from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_torch import DEFAULT, build  # noqa: E402
from figures import Figure, add_option, at_most, write  # noqa: E402


def main(argv=None) -> int:
    from alloctrace.traces.export.report_html import build as report
    from alloctrace.traces.sources import import_paths
    from alloctrace.traces.store.store import open_store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    add_option(ap)
    args = ap.parse_args(argv)
    d = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        n = build(DEFAULT, d / "big.pickle", args.entries)
        store = open_store(str(d / "s"))
        t = time.perf_counter()
        tid = import_paths(store, [d / "big.pickle"])[0]
        t_import = time.perf_counter() - t
        t = time.perf_counter()
        big = len(report(store, tid).encode())
        t_report = time.perf_counter() - t
        small = len(report(store, import_paths(store, [DEFAULT])[0]).encode())
    finally:
        shutil.rmtree(d)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"entries {n:,}: import {t_import:.1f} s, report {t_report:.1f} s, {big:,} bytes "
          f"({big / small:.3f}x the {DEFAULT.name} report's {small:,}); peak RSS {rss:.0f} MB")
    write(args.json, [at_most(f"report size, {n:,}-entry snapshot", big / 1e6, "MB", 10,
                              f"the {DEFAULT.name} report: {small / 1e6:.2f} MB"),
                      Figure("report size / fixture report size", round(big / small, 3), "x")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
