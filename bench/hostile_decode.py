"""Rows of the hostile battery for the decoding budget (docs/limits.md): compression bombs of each codec
under the old 2 GiB cap, the densest snapshot, a deeply nested pickle; on the CLI (peak RSS, wall time)
and as uploads to a server that must answer its next request. Each must stay within 1 GB and 20 s."""
from __future__ import annotations

import json
import time

from hostile_inputs import (cli_peak_rss, codec_log_bomb, deep_tuple_snapshot, dense_snapshot_zstd, peak_rss_of,
                            shared_long_stack_snapshot, shared_long_string_snapshot)


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
    shared_stack_answer(work, st, row, serve_code)


def shared_stack_answer(work, st, row, serve_code):
    """One 20,000-frame stack of 2 KB file names named by 300 entries: a page of them with frames would be a
    12 GB answer; the answer budget (256 MiB) refuses it, and the server answers its next request."""
    path = shared_long_stack_snapshot(work / "stack.pickle")
    t = time.perf_counter()
    p, peak = peak_rss_of(serve_code(st.path, f"""
        r = c.post("/api/torch/traces", files={{"file": ("stack.pickle", open({str(path)!r}, "rb").read())}})
        tid = r.json()["traces"][0]["id"]
        t = time.perf_counter()
        r = c.get(f"/api/torch/traces/{{tid}}/devices/0/entries", params={{"frames": "true", "limit": 300}})
        print(r.status_code, len(r.content), "B in", round(time.perf_counter() - t, 2), "s:", r.json()["detail"][:60])
        print("next:", c.get("/api/traces").status_code)
        c.delete(f"/api/traces/{{tid}}")
    """), timeout=600)
    row(f"15 GET entries?frames=true&limit=300: 300 entries sharing one 20,000-frame stack ({path.stat().st_size:,} B)",
        " / ".join(p.stdout.strip().split("\n")) or p.stderr[-300:], peak, time.perf_counter() - t)


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


def child_cost(work, st, row, n: int = 8):
    """What reading each upload in a child costs the server: uploads of the real gpt2 snapshot and log through
    the fork server's children, read in the server's process (ALLOCTRACE_IMPORT_IN_PROCESS=1), and, for the
    fresh interpreter each upload started before, that interpreter's start with the same modules imported."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from fastapi.testclient import TestClient

    from alloctrace.server.app import create_app
    from alloctrace.traces.sources.child import PRELOAD

    root = Path(__file__).resolve().parent.parent
    inputs = {"gpt2 snapshot (pickle.gz)": ("/api/torch/traces", root / "tests/data/torch/gpt2_train_bs16.pickle.gz"),
              "gpt2 log": ("/api/traces", root / "tests/data/hostile/gpt-2_tiny_short.AT.log")}
    fresh = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-P", "-c", "import importlib; [importlib.import_module(m) for m in "
                        f"{PRELOAD!r}]"], check=True)
        fresh.append(time.perf_counter() - t)
    fresh_s = sorted(fresh)[n // 2]
    with TestClient(create_app(store_dir=work / "child-cost")) as c:
        for label, (url, path) in inputs.items():
            data = path.read_bytes()
            took = {}
            for mode in ("child", "in process", "child", "in process"):  # alternating: a noisy machine
                os.environ["ALLOCTRACE_IMPORT_IN_PROCESS"] = "1" if mode == "in process" else "0"
                times = []
                for _ in range(n):
                    t = time.perf_counter()
                    r = c.post(url, files={"file": (path.name, data)})
                    times.append(time.perf_counter() - t)
                    assert r.status_code == 201, r.text[:300]
                took.setdefault(mode, []).extend(times)
            os.environ.pop("ALLOCTRACE_IMPORT_IN_PROCESS")
            child, inproc = (sorted(took[m])[len(took[m]) // 2] for m in ("child", "in process"))
            row(f"16 upload: {label}, median of {2 * n}",
                f"fork-server child {child * 1000:.0f} ms, in process {inproc * 1000:.0f} ms: ratio "
                f"{child / inproc:.2f}; a fresh interpreter per upload added {fresh_s * 1000:.0f} ms "
                f"(ratio {(inproc + fresh_s) / inproc:.2f})", wall=child)
