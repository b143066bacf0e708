"""Run the hostile-input battery at the issue's sizes and print one row per attack:
input, outcome, peak RSS of the process that took it, and whether the store kept its
other trace intact (same summary, same events, `PRAGMA integrity_check` ok).

    python bench/bench_hostile.py [--quick] [--work DIR] [--only disk]

--only disk runs only the rows of bench/hostile_disk.py (planted libraries, amplified and impossible
PyTorch snapshots, damaged stores, the smaller refusals), each with its wall time; --only decode the rows
of bench/hostile_decode.py (compression bombs of each codec, the densest snapshot, a nested pickle); --only child
what reading each upload in a child costs the server (fork server vs in process vs a fresh interpreter).

--quick shrinks the slowest inputs (the 5 GB gzip text bomb becomes 1 GB, the 10^6-event
/state graph 600k). Every attack runs in a fresh child process; peak RSS is its ru_maxrss.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hostile_inputs import (cli_peak_rss, distinct_names_log, gzip_text_bomb, long_graph_log,  # noqa: E402
                            many_graphs_zstd, peak_rss_of, same_name_log, zstd_zero_bomb)

GPT2 = ROOT / "tests" / "data" / "hostile" / "gpt-2_tiny_short.AT.log"
MB = 1 << 20


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "alloctrace", *map(str, args)], capture_output=True, text=True, **kw)


def outcome(p) -> str:
    err = p.stderr.strip().splitlines()
    if p.returncode == 0:
        return "exit 0"
    last = err[-1] if err else ""
    return f"exit {p.returncode}: {last.removeprefix('alloctrace: error: ')[:90]}" + \
        (" [TRACEBACK]" if "Traceback" in p.stderr else "")


class Store:
    """A store with one sentinel trace; `intact()` checks it survived an attack unchanged."""

    def __init__(self, path: Path):
        self.path = path
        p = cli("import", GPT2, "--store", path, "--json", "--name", "sentinel")
        self.tid = json.loads(p.stdout)["traces"][0]["id"]
        self.before = self._facts()

    def _facts(self):
        from alloctrace.traces.store.store import open_store
        s = open_store(self.path)
        try:
            summary = s.summary(self.tid)
            events = [s.events(self.tid, g["index"]) for g in summary["graphs"]]
            ok = s.db.execute("PRAGMA integrity_check").fetchone()[0]
            return summary, events, ok
        finally:
            s.close()

    def intact(self) -> str:
        try:
            summary, events, ok = self._facts()
        except Exception as e:  # noqa: BLE001 - a broken store is what this reports
            return f"NO ({e})"
        return "yes" if (summary, events) == self.before[:2] and ok == "ok" else "NO"


def serve_code(store: Path, body: str, limits: str = "None") -> str:
    return f"""
        import time, json
        from fastapi.testclient import TestClient
        from alloctrace.server.app import create_app
        from alloctrace.server.guard import allowed_hosts
        from alloctrace.traces.sources.bounded_io import Limits
        c = TestClient(create_app({str(store)!r}, hosts=allowed_hosts("127.0.0.1"), limits={limits}),
                       base_url="http://127.0.0.1:8000")
        def up(p, **kw):
            return c.post("/api/traces", files={{"file": (p.split("/")[-1], open(p, "rb").read())}}, **kw)
    """ + body


def battery(work: Path, quick: bool, only: str | None = None):
    st = Store(work / "store")
    rows = []

    def row(name, result, peak=None, wall=None, st_intact=None):
        rows.append((name, result, peak, st_intact or st.intact(), wall))
        print(f"  {name}: {result}", file=sys.stderr, flush=True)

    from hostile_decode import battery as decode_battery, child_cost
    from hostile_disk import battery as disk_battery
    if only == "disk":
        disk_battery(work, st, row)
        return rows
    if only == "decode":
        decode_battery(work, st, row, serve_code, outcome)
        return rows
    if only == "child":
        child_cost(work, st, row)
        return rows

    # 1: decompression bombs
    bomb = zstd_zero_bomb(work / "zeros.zst")
    p, peak = cli_peak_rss(["import", str(bomb), "--store", str(st.path)])
    row(f"1 import: zstd of 4 GiB zeros ({bomb.stat().st_size // 1000} KB)", outcome(p), peak)

    size = (1 if quick else 5) << 30
    text = work / f"text{size >> 30}g.gz"
    if not text.exists():
        gzip_text_bomb(text, size)
    cap = ["--max-decompressed", "512M"] if quick else []  # quick: a 1 GiB bomb against a 512 MiB cap
    p, peak = cli_peak_rss(["import", str(text), "--store", str(st.path), *cap], timeout=1800)
    row(f"1 import: gzip of {size >> 30} GiB text ({text.stat().st_size // MB} MB), cap "
        f"{'512 MiB' if quick else '64 MiB (default)'}", outcome(p), peak)
    p, peak = peak_rss_of(serve_code(st.path, f"""
        r = up({str(bomb)!r}); print(r.status_code, r.json()["detail"])
        t = time.perf_counter(); c.get("/api/traces"); print("list", round(time.perf_counter() - t, 2))
    """))
    row("1 upload: the 4 GiB zstd bomb", " / ".join(p.stdout.split("\n")[:2]) or outcome(p), peak)

    # 2: /state on long graphs
    for n in ((600_000,) if quick else (600_000, 1_000_000)):
        z = long_graph_log(work / f"long{n}.log.zst", n)
        p = cli("import", z, "--store", st.path, "--json", timeout=600)
        tid = json.loads(p.stdout)["traces"][0]["id"]
        p, peak = peak_rss_of(serve_code(st.path, f"""
        t = time.perf_counter()
        r = c.get("/api/traces/{tid}/graphs/0/state", params={{"event": {n + 1}}})
        print(r.status_code, len(r.json()["live"]), "live,", round(time.perf_counter() - t, 1), "s")
        """), timeout=900)
        row(f"2 GET state at event {n + 1:,} ({z.stat().st_size:,} B upload)", p.stdout.strip() or outcome(p), peak)
        cli("rm", tid, "--store", st.path)

    # 3: cross-site requests
    p, peak = peak_rss_of(serve_code(st.path, f"""
        evil = {{"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"}}
        a = up({str(GPT2)!r}, headers=evil).status_code
        b = c.delete("/api/traces/{st.tid}", headers={{"Host": "attacker.example"}}).status_code
        d = c.get("/api/traces").status_code
        print(f"no-cors POST {{a}}, rebinding DELETE {{b}}, plain GET {{d}}")
    """))
    row("3 cross-site POST / DNS-rebinding DELETE", p.stdout.strip() or outcome(p), peak)

    # 5: distinct names
    for n in (35_000, 70_000, 100_000):
        log = distinct_names_log(work / f"d{n}.log", n)
        t = time.perf_counter()
        p, peak = cli_peak_rss(["import", str(log), "--store", str(st.path), "--json"], timeout=900)
        took = time.perf_counter() - t
        row(f"5 import: one graph of {n:,} distinct names", f"{outcome(p)} in {took:.1f} s", peak)
        if p.returncode == 0:
            cli("rm", json.loads(p.stdout)["traces"][0]["id"], "--store", st.path)

    # 6: disk full (a file size limit on the importing process)
    limit = 32 * 1024  # no file of the store may grow past 32 KiB

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(work / "d35000.log"), "--store",
                        str(st.path)], capture_output=True, text=True, preexec_fn=small_disk)
    wal = st.path / "alloctrace.db-wal"
    row("6 import onto a full disk (RLIMIT_FSIZE 32 KiB)",
        f"{outcome(p)}; WAL {wal.stat().st_size if wal.exists() else 0:,} B")

    # 7: export -o special files
    fifo = work / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.DEVNULL)
    p = cli("export", st.tid, "--format", "csv", "-o", fifo, "--store", st.path)
    reader.wait(30)
    link, target = work / "link.csv", work / "target.csv"
    target.write_text("x")
    os.chmod(target, 0o640)
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    q = cli("export", st.tid, "--format", "csv", "-o", link, "--store", st.path)
    row("7 export -o FIFO / symlink to a 0640 file",
        f"FIFO {outcome(p)}, still a FIFO: {fifo.is_fifo()}; symlink {outcome(q)}, still a link: "
        f"{link.is_symlink()}, mode {oct(target.stat().st_mode & 0o777)}")

    # 8 and 13: malformed JSON Lines, impossible numbers
    head = {"type": "trace", "version": 1, "name": "x", "source": "s", "generation": "g"}
    cases = {"duplicate graph index": [{"index": 0}, {"index": 0}], "role <script>": [{"role": "<script>"}],
             "graph index int64 max": [{"index": 2 ** 63 - 1}]}
    for label, graphs in cases.items():
        f = work / "bad.jsonl"
        f.write_text("\n".join(json.dumps(x) for x in [head] + [
            {"type": "graph", "index": 0, "role": "eval", "n_events": 0, **g} for g in graphs]) + "\n")
        row(f"8 import JSONL: {label}", outcome(cli("import", f, "--store", st.path)))
    for label, line in {"size int64 max": "ggml_allocr_alloc: allocating x (9223372036854775807 bytes) - block 0",
                        "block -99999": "ggml_allocr_alloc: allocating x (32 bytes) - block -99999",
                        "-2048 bytes": "ggml_allocator_free_tensor: freeing x (-2048 bytes) - n_free_blocks = 1"
                        }.items():
        f = work / "bad.log"
        f.write_text("####### graph 0/1\n" + line + "\n")
        row(f"13 import log: {label}", outcome(cli("import", f, "--store", st.path)))

    # 9: terminal escapes
    evil = "evil\x1b]0;pwned\x07\nFAKE row"
    # a tag of its own: the same file imported again with the same tags is the sentinel's trace (stored_before)
    p = cli("import", GPT2, "--store", st.path, "--name", evil, "--tag", "row=9", "--json")
    tid = json.loads(p.stdout)["traces"][0]["id"]
    out = cli("list", "--store", st.path).stdout
    row("9 list with an OSC sequence and a newline in a name",
        "escaped" if "\x1b" not in out and "\\x1b]0;pwned" in out else "RAW ESCAPES")
    cli("rm", tid, "--store", st.path)

    # 10: tokens
    p = cli("serve", "--store", st.path, "--port", "1", "--token", "tök&+")
    row("10 serve --token 'tök&+'", outcome(p))

    # 11: two servers, one store
    p, peak = peak_rss_of(f"""
        from fastapi.testclient import TestClient
        from alloctrace.server.app import create_app
        a, b = TestClient(create_app({str(st.path)!r})), TestClient(create_app({str(st.path)!r}))
        tid = a.post("/api/traces", files={{"file": ("x.log", open({str(GPT2)!r}, "rb").read())}}).json()["traces"][0]["id"]
        u = f"/api/traces/{{tid}}/graphs/1/memory-map"
        first = a.get(u).status_code
        b.delete(f"/api/traces/{{tid}}")
        print(f"A {{first}}, B deletes, A again {{a.get(u).status_code}}")
    """)
    row("11 stale cache: memory map after a delete on another server", p.stdout.strip() or outcome(p), peak)

    # 12: resource use at the boundaries
    same = work / "same.log"
    if not same.exists():
        same_name_log(same, 1_000_000)
    p, peak = cli_peak_rss(["import", str(same), "--store", str(st.path), "--json"], timeout=900)
    row(f"12 import: {same.stat().st_size / 1e6:.0f} MB log of 10^6 same-named allocations", outcome(p), peak)
    if p.returncode == 0:
        cli("rm", json.loads(p.stdout)["traces"][0]["id"], "--store", st.path)
    z = many_graphs_zstd(work / "many.zst", 23_087)
    p, peak = cli_peak_rss(["import", str(z), "--store", str(st.path)], timeout=900)
    row(f"12 import: {z.stat().st_size:,} B zstd of 23,087 graphs (default caps)", outcome(p), peak)

    # 14: truncated compressed file, log that ends mid-graph
    whole = gzip.compress(GPT2.read_bytes()[:40_000])
    cut = work / "cut.log.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    row("14 import: gzip cut in half", outcome(cli("import", cut, "--store", st.path)))
    p = cli("import", cut, "--store", st.path, "--salvage", "--json")
    if p.returncode == 0:
        tid = json.loads(p.stdout)["traces"][0]["id"]
        s = json.loads(cli("show", tid, "--json", "--store", st.path).stdout)
        row("14 import --salvage: gzip cut in half",
            f"exit 0, truncated={s['truncated']}, last graph complete={s['graphs'][-1]['complete']}")
        cli("rm", tid, "--store", st.path)
    decode_battery(work, st, row, serve_code, outcome)
    child_cost(work, st, row)
    disk_battery(work, st, row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller slow inputs")
    ap.add_argument("--work", type=Path, help="folder for the generated inputs (kept between runs)")
    ap.add_argument("--only", choices=["disk", "decode", "child"], help="only the rows of bench/hostile_disk.py, "
                    "of bench/hostile_decode.py (the decoding budget), or the cost of reading an upload in a "
                    "child (hostile_decode.child_cost)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = battery(work, args.quick, args.only)
    w = max(len(r[0]) for r in rows)
    print(f"{'INPUT':<{w}}  {'PEAK RSS':>9}  {'WALL':>7}  {'STORE':<6}  OUTCOME")
    for name, result, peak, intact, wall in rows:
        rss = f"{peak / MB:,.0f} MB" if peak else "-"
        took = f"{wall:.1f} s" if wall is not None else "-"
        print(f"{name:<{w}}  {rss:>9}  {took:>7}  {intact:<6}  {result}")


if __name__ == "__main__":
    main()
