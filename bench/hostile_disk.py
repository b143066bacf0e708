"""The bench_hostile rows for what alloctrace trusts on disk and in a pickle: planted libraries, amplified
and impossible PyTorch snapshots, damaged stores, and the smaller refusals (a recording naming an unknown
buffer type, an absolute-form request line, a trace page without the token, an inert what-if setting).

`battery(work, st, row)` adds one row per input: its outcome, the peak RSS and wall time of the process
that took it (CLI or server), and whether the store's sentinel trace stayed intact."""
from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hostile_inputs import (bad_value_snapshots, cli_peak_rss, long_graph_log, peak_rss_of,  # noqa: E402
                            shared_blocks_snapshot, shared_frames_snapshot, write_pickle)

GPT2 = ROOT / "tests" / "data" / "hostile" / "gpt-2_tiny_short.AT.log"
TORCH = ROOT / "tests" / "data" / "torch" / "small_default.pickle.gz"
PROGRAM = ROOT / "tests" / "data" / "record" / "exit3.py"
RECORDING = ROOT / "tests" / "data" / "record" / "gallocr-mlp.atrec"
NOBODY = 65534
WRAPPER = ("import re, runpy, sys\nsys.argv[0] = 'alloctrace'\ntry:\n    runpy.run_module('alloctrace', "
           "run_name='__main__')\nfinally:\n    hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())"
           "\n    print('PEAK_RSS', int(hwm.group(1)) * 1024, file=sys.stderr)\n")  # the command in this process: its peak


def _outcome(p) -> str:
    err = p.stderr.strip().splitlines()
    last = err[-1].removeprefix("alloctrace: error: ")[:100] if err else ""
    return (f"exit {p.returncode}" + (f": {last}" if p.returncode else "")
            + (" [TRACEBACK]" if "Traceback" in p.stderr else ""))


def timed_cli(args, **kw):
    t = time.perf_counter()
    p, peak = cli_peak_rss([str(a) for a in args], **kw)
    return p, peak, time.perf_counter() - t


def server_row(row, name: str, store: Path, body: str, **kw):
    """Run `body` against a TestClient app on `store` in a fresh process; it prints its own outcome."""
    code = textwrap.dedent(f"""
        import time, json
        from fastapi.testclient import TestClient
        from alloctrace.server.app import create_app
        c = TestClient(create_app({str(store)!r}), base_url="http://127.0.0.1:8000")
        t0 = time.perf_counter()
    """) + textwrap.dedent(body) + textwrap.dedent("""
        print(f"in {time.perf_counter() - t0:.1f} s")
    """)
    t = time.perf_counter()
    p, peak = peak_rss_of(code, timeout=300, **kw)
    out = " ".join(p.stdout.split()) or _outcome(p)
    row(name, out + (" [TRACEBACK]" if "Traceback" in p.stderr else ""), peak, time.perf_counter() - t)


def battery(work: Path, st, row):
    _libraries(work, row)
    _snapshots(work, st, row)
    _damaged(work, st, row)
    _smaller(work, st, row)


# --- 1: planted libraries --------------------------------------------------------------------------------
def _libraries(work: Path, row):
    from alloctrace.traces.sources.ggml_log import fastlog
    from alloctrace.traces.sources.record import build
    from alloctrace.traces.util import cbuild

    cc = cbuild.find_compiler()
    if os.getuid() != 0 or not shutil.which("setpriv") or cc is None:
        row("22.1 planted libraries (as uid 65534)", "skipped: needs root, setpriv and a C compiler")
        return
    top = Path(tempfile.mkdtemp(prefix="alloctrace-planted-", dir="/tmp"))
    top.chmod(0o755)
    try:
        for name, mode in (("home", 0o755), ("tmp", 0o1777), ("out", 0o777)):
            (top / name).mkdir()
            (top / name).chmod(mode)
        marker = top / "out" / "planted-ran"
        src = top / "planted.c"
        src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void p(void) {{ FILE *f = fopen('
                       f'"{marker}", "w"); if (f) fclose(f); }}\n' +
                       "".join(f"void {s}(void) {{}}\n" for s in build.SYMBOLS + fastlog.SYMBOLS))
        names = (cbuild.library_name(build.SOURCE, "recorder", cbuild.RECORDER_FLAGS),
                 cbuild.library_name(fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS))
        for folder in (top / "tmp" / f"alloctrace-{NOBODY}", top / "home" / ".cache" / "alloctrace"):
            folder.mkdir(parents=True)
            for n in names:
                subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / n), str(src)], check=True)
            folder.chmod(0o777)
        env = {"PATH": os.environ["PATH"], "HOME": str(top / "home"), "TMPDIR": str(top / "tmp"),
               "PYTHONDONTWRITEBYTECODE": "1", "ALLOCTRACE_PURE_PYTHON": "0"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable]
        probe = subprocess.run([*user, "-c", "import os, shutil, sys, ggml; from alloctrace.traces.sources import "
                                "registered; registered(); print(sys.executable if os.path.exists(sys.executable) "
                                "else shutil.which('python3'))"],
                               env=env, cwd=top, capture_output=True, text=True)
        if probe.returncode:
            row("22.1 planted libraries (as uid 65534)", "skipped: uid 65534 cannot import this Python's packages "
                "(name a readable copy in PYTHONPATH)")
            return
        python = probe.stdout.strip()
        for label, args in (("record -- python prog.py", ["record", "-o", "r.atrec", "--", python, str(PROGRAM)]),
                            ("import of a log (fast reader)", ["import", str(GPT2), "--store", "store"])):
            t = time.perf_counter()
            p = subprocess.run([*user, "-c", WRAPPER, *args], env=env, cwd=top / "out", capture_output=True,
                               text=True, timeout=300)
            peak = next((int(ln.split()[1]) for ln in p.stderr.splitlines() if ln.startswith("PEAK_RSS ")), None)
            p.stderr = "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith("PEAK_RSS "))
            row(f"22.1 {label}, planted in $TMPDIR/alloctrace-uid and ~/.cache, HOME read-only",
                f"{_outcome(p)}; planted code ran: {'YES' if marker.exists() else 'no'}", peak,
                time.perf_counter() - t)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    cache = Path(tempfile.mkdtemp(prefix="alloctrace-cache-"))
    try:
        (cache / "alloctrace").mkdir(mode=0o700)
        (cache / "alloctrace" / names[0]).write_bytes(b"")
        p, peak, wall = timed_cli(["record", "-o", cache / "r", "--", sys.executable, PROGRAM],
                                  env={**os.environ, "XDG_CACHE_HOME": str(cache)})
        row("22.1 record with a zero-byte cached recorder", _outcome(p), peak, wall)
        spaced = cache / "a b"
        p, peak, wall = timed_cli(["record", "-o", cache / "r", "--", sys.executable, PROGRAM],
                                  env={**os.environ, "XDG_CACHE_HOME": str(spaced)})
        row("22.1 record with a cache path holding a space", _outcome(p), peak, wall)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --- 2: PyTorch snapshots --------------------------------------------------------------------------------
def _snapshots(work: Path, st, row):
    inputs = {label: write_pickle(work / f"bad{i}.pickle", snap) for i, (label, snap) in
              enumerate(bad_value_snapshots().items())}
    inputs["3,000 segments sharing 3,000 blocks"] = shared_blocks_snapshot(work / "sb3k.pickle", 3000, 3000)
    inputs["10,000 segments sharing 10,000 blocks"] = shared_blocks_snapshot(work / "sb10k.pickle", 10_000, 10_000)
    inputs["2,000 entries sharing 10^6 frames"] = shared_frames_snapshot(work / "fr2k.pickle", 2000, 1_000_000)
    inputs["200,000 entries sharing 10^6 frames"] = shared_frames_snapshot(work / "fr200k.pickle", 200_000,
                                                                           1_000_000)
    for label, path in inputs.items():
        size = f"{path.stat().st_size / 1e3:,.0f} KB"
        p, peak, wall = timed_cli(["import", path, "--store", st.path], timeout=300)
        row(f"22.2 import snapshot: {label} ({size})", _outcome(p), peak, wall)
        server_row(row, f"22.2 POST /api/torch/traces: {label}", st.path, f"""
            r = c.post("/api/torch/traces", files={{"file": ("x.pickle", open({str(path)!r}, "rb").read())}})
            print(r.status_code, str(r.json().get("detail", ""))[:80])
            if r.status_code == 201:
                c.delete("/api/traces/" + r.json()["traces"][0]["id"])
        """)
        if p.returncode == 0:
            _drop_all_but(st)


def _drop_all_but(st):
    from alloctrace.traces.store.store import open_store
    s = open_store(st.path)
    for t in s.list():
        if t["id"] != st.tid:
            s.delete(t["id"])
    s.close()


# --- 3: a damaged store ----------------------------------------------------------------------------------
def _damaged(work: Path, st, row):
    import json

    victims = iter(range(1, 1 << 20))

    def victim(path=GPT2) -> str:
        # a tag of its own: the same file imported again with the same tags is the trace stored before (the
        # sentinel's), which this would damage and delete
        p = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(path), "--store", str(st.path),
                            "--tag", f"victim={next(victims)}", "--json"], capture_output=True, text=True)
        return json.loads(p.stdout)["traces"][0]["id"]

    def sql(statement, *args):
        with sqlite3.connect(st.path / "alloctrace.db") as db:
            return db.execute(statement, args).fetchall()

    def flip(tid, field, g):
        (blob,) = sql(f"SELECT {field} FROM graphs WHERE trace_id=? AND idx=?", tid, g)[0]
        b = bytearray(blob)
        for k in range(len(b) // 3, len(b) // 3 + 8):
            b[k] ^= 0x5A
        sql(f"UPDATE graphs SET {field}=? WHERE trace_id=? AND idx=?", bytes(b), tid, g)

    (version,) = sql("SELECT value FROM store_info WHERE key='format_version'")[0]
    sql("UPDATE store_info SET value='abc' WHERE key='format_version'")
    p, peak, wall = timed_cli(["list", "--store", st.path])
    row("22.3 store_info.format_version = 'abc': list", _outcome(p), peak, wall, st_intact="(broken as a whole)")
    sql("UPDATE store_info SET value=? WHERE key='format_version'", version)
    cases = [("traces.tags not JSON", "UPDATE traces SET tags='{x' WHERE id=?", ["show", "ID"]),
             ("traces.extra not JSON", "UPDATE traces SET extra='{x' WHERE id=?",
              ["export", "ID", "--format", "jsonl", "-o", work / "x.jsonl"]),
             ("graphs.extra not JSON", "UPDATE graphs SET extra='{x' WHERE trace_id=?",
              ["export", "ID", "--format", "jsonl", "-o", work / "x.jsonl"]),
             ("n_events = 10^12", "UPDATE graphs SET n_events=1000000000000 WHERE trace_id=? AND idx=1",
              ["peak", "ID:1"])]
    for label, statement, args in cases:
        tid = victim()
        sql(statement, tid)
        p, peak, wall = timed_cli([a.replace("ID", tid) if isinstance(a, str) else a for a in args]
                                  + ["--store", st.path])
        row(f"22.3 {label}: {args[0]}", _outcome(p), peak, wall)
        subprocess.run([sys.executable, "-m", "alloctrace", "rm", tid, "--store", str(st.path)], capture_output=True)
    for field in ("packed", "strings"):
        tid, torch = victim(), victim(TORCH)
        flip(tid, field, 1)
        flip(torch, field, 0)
        for args in (["peak", f"{tid}:1"], ["export", tid, "--format", "csv", "-o", work / "x.csv"],
                     ["state", torch, "--event", "end"], ["whatif", torch, "--set", "expandable_segments=true"]):
            p, peak, wall = timed_cli([*args, "--store", st.path])
            row(f"22.3 flipped bits in {field}: {args[0]}", _outcome(p), peak, wall)
        server_row(row, f"22.3 flipped bits in {field}: GET .../state, then the sentinel", st.path, f"""
            a = c.get("/api/traces/{tid}/graphs/1/state", params={{"event": 3}})
            b = c.get("/api/traces/{st.tid}/graphs/1/state", params={{"event": 3}})
            print(a.status_code, a.json()["detail"][:60], "/ sentinel", b.status_code)
        """)
        for args in (["doctor"], ["doctor", "--delete", "--yes"]):
            p, peak, wall = timed_cli([*args, "--store", st.path])
            said = (p.stdout.strip().splitlines() or [""])[-1][:90]
            row(f"22.3 {' '.join(args)} after flipped bits in {field}", f"exit {p.returncode}: {said}", peak, wall)
    long = victim(long_graph_log(work / "long200k.log.zst", 200_000))
    sql("UPDATE state_checkpoints SET data=? WHERE trace_id=?", b"\x28\xb5\x2f\xfd garbage", long)
    sql("UPDATE memmap_lod SET data=? WHERE trace_id=?", b"not zstd", long)
    server_row(row, "22.3 damaged state_checkpoints and memmap_lod: GET state, memory-map", st.path, f"""
        a = c.get("/api/traces/{long}/graphs/0/state", params={{"event": 150000}})
        b = c.get("/api/traces/{long}/graphs/0/memory-map")
        ctx = c.app.state.ctx
        if ctx.keeping is not None:
            ctx.keeping.join(120)
        print("state", a.status_code, "map", b.status_code)
    """)
    from alloctrace.traces.store.store import open_store
    s = open_store(st.path)
    try:
        saved = s.saved_states(long, 0)
        ok = saved is not None and all(saved.load(m) for m in saved.marks)
        row("22.3 ... the derived rows afterwards", f"state checkpoints {'readable' if ok else 'NOT readable'}, "
            f"memory-map lifetimes {'readable' if s.saved_lifetimes(long, 0) is not None else 'absent'}")
    except Exception as e:  # noqa: BLE001 - what this row reports
        row("22.3 ... the derived rows afterwards", f"NOT readable: {type(e).__name__}: {e}"[:100])
    finally:
        s.close()
    subprocess.run([sys.executable, "-m", "alloctrace", "rm", long, "--store", str(st.path)], capture_output=True)


# --- 4: smaller items ------------------------------------------------------------------------------------
def _smaller(work: Path, st, row):
    no_t = work / "no-T.atrec"
    no_t.write_text("".join(ln for ln in RECORDING.read_text().splitlines(True) if not ln.startswith("T ")))
    p, peak, wall = timed_cli(["import", no_t, "--store", st.path])
    row("22.4 recording whose buffer type has no T line", _outcome(p), peak, wall)
    from conftest import free_port
    port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "alloctrace", "serve", "--store", str(st.path), "--port",
                              str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = None
        for _ in range(600):
            try:
                status = _raw_get(port, "http://evil.example/api/traces", f"127.0.0.1:{port}")
                break
            except OSError:
                time.sleep(0.2)
        row("22.4 GET http://evil.example/api/traces (absolute form, right Host)", f"HTTP {status}")
    finally:
        serve.terminate()
        serve.wait(30)
    server_row(row, "22.4 /traces/{id} without the token: PyTorch vs ggml trace", st.path, f"""
        from alloctrace.server.app import create_app as make
        c = TestClient(make({str(st.path)!r}, token="t0k"), base_url="http://127.0.0.1:8000")
        auth = {{"Authorization": "Bearer t0k"}}
        t = c.post("/api/torch/traces", files={{"file": ("t.pickle.gz", open({str(TORCH)!r}, "rb").read())}},
                   headers=auth).json()["traces"][0]["id"]
        a = c.get("/traces/" + t, follow_redirects=False).status_code
        b = c.get("/traces/{st.tid}", follow_redirects=False).status_code
        c.delete("/api/traces/" + t, headers=auth)
        print("torch", a, "ggml", b)
    """)
    p, peak, wall = timed_cli(["whatif", TORCH, "--set", "garbage_collection_threshold=0.5", "--store", st.path])
    note = next((ln for ln in p.stdout.splitlines() if ln.startswith("note: garbage")), "no note")
    row("22.4 whatif garbage_collection_threshold=0.5 without a cap", f"exit {p.returncode}; {note[:70]}", peak,
        wall)
    _drop_all_but(st)


def _raw_get(port: int, target: str, host: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])
