"""Rows of the hostile battery for the decoding budget (docs/limits.md): compression bombs of each codec
under the old 2 GiB cap, the densest snapshot, a deeply nested pickle; on the CLI (peak RSS, wall time)
and as uploads to a server that must answer its next request. Each must stay within 1 GB and 20 s."""
from __future__ import annotations

import json
import time

from hostile_inputs import (cli_peak_rss, codec_log_bomb, deep_tuple_snapshot, dense_snapshot_zstd, peak_rss_of,
                            shared_long_string_snapshot)


def battery(work, st, row, serve_code, outcome):
    inputs = [(f"{codec} of 72 MiB of log", codec_log_bomb(work / f"bomb72.{codec}", codec))
              for codec in ("gzip", "zstd", "xz")]
    dense = work / "dense.pickle.zst"
    if not dense.exists():
        dense_snapshot_zstd(dense)
    inputs += [("zstd snapshot of 2M small dicts", dense),
               ("pickle of tuples nested 200,000 deep", deep_tuple_snapshot(work / "deep.pickle"))]
    for label, path in inputs:
        t = time.perf_counter()
        p, peak = cli_peak_rss(["import", str(path), "--store", str(st.path)], timeout=600)
        row(f"15 import: {label} ({path.stat().st_size:,} B)", outcome(p), peak, time.perf_counter() - t)
        t = time.perf_counter()
        p, peak = peak_rss_of(serve_code(st.path, f"""
        r = up({str(path)!r}); print(r.status_code, r.json()["detail"][:70])
        print("next:", c.get("/api/traces").status_code)
        """), timeout=600)
        row(f"15 upload: {label}", " / ".join(p.stdout.strip().split("\n")) or outcome(p), peak,
            time.perf_counter() - t)
    shared_report(work, st, row, outcome)


def shared_report(work, st, row, outcome):
    """One 1 MB filename shared by every frame of 2,000 entries: the import cuts each frame's text, so the
    report stays small (152 MB, 134 s and 10.4 GB before the cut)."""
    path = shared_long_string_snapshot(work / "long.pickle")
    p, _ = cli_peak_rss(["import", str(path), "--store", str(st.path), "--json"], timeout=600)
    if p.returncode != 0:
        row("15 report: one 1 MB filename shared by every frame", outcome(p))
        return
    tid = json.loads(p.stdout)["traces"][0]["id"]
    out = work / "long.html"
    t = time.perf_counter()
    p, peak = cli_peak_rss(["report", tid, "-o", str(out), "--store", str(st.path)], timeout=600)
    size = f", {out.stat().st_size:,} B of HTML" if out.exists() else ""
    row(f"15 report: one 1 MB filename shared by every frame ({path.stat().st_size:,} B)", outcome(p) + size,
        peak, time.perf_counter() - t)
    cli_peak_rss(["rm", tid, "--store", str(st.path)])
