"""The shared store against the local one: import and list on PostgreSQL and SQLite, and requests per second
with 1, 2 and 4 server workers over PostgreSQL.

Imports the same real files into an SQLite store and a PostgreSQL database (a throwaway cluster made with
initdb/pg_ctl, or $ALLOCTRACE_TEST_PG), then lists them, --import-rounds times (fresh stores each round, the
two in turn); figures are PostgreSQL's time as a ratio to SQLite's, the median of the rounds' ratios. Then
each trace again into both stores in turn: the median time to store one, per backend. Then `alloctrace serve
--workers N` over the PostgreSQL store, driven by --clients clients (keeping their connections, as browsers
and HTTP libraries do, or with --fresh each request on a new one; from a process of their own:
bench/http_load.py, whose CPU per request is shown) asking for trace summaries, a tag's list and memory-map
windows of 6 traces: every worker count's server started at once, --warmup seconds unmeasured each (workers
start, caches fill), then --rounds rounds of --seconds each, the worker counts in turn; figures are each round's ratio to 1 worker, the rounds' median.
The history: --history-traces tagged traces (commit, config, model) stored on each backend, then the history
API's answer (GET /api/history's function: a page of 50 commits first asked for, the first page asked for
again, one tag's) against a summary of every trace (store.list(), which the history made before) in the same
run, and against its goal (200 ms).

    python bench/bench_team.py [--copies 20] [--clients 50] [--seconds 4] [--rounds 5] [--warmup 5] [--workers 1,2,4]
                               [--import-rounds 5] [--history-traces 10000] [--parts import,history,serve] [--fresh]
                               [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from figures import Figure, add_option, at_most, write  # noqa: E402
FILES = [ROOT / "tests" / "data" / "explain" / "llama-tiny_c512_ub64.head.AT.log.gz",
         ROOT / "tests" / "data" / "compare" / "tiny-llama-fa-off.atrec.gz",
         ROOT / "tests" / "data" / "explain" / "gpt-2_tiny_long.2023-08-28.AT+DEBUG.log.gz"]


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def import_and_list(ref: str, copies: int) -> dict:
    from alloctrace.traces.sources import read_file, store_traces
    from alloctrace.traces.store.store import open_store

    store = open_store(ref)
    read = [t for f in FILES for t in read_file(f)]  # parsed once: the store's share is what is measured

    def add():
        for k in range(copies):
            for t in read:
                t.meta.tags = [f"copy={k}"]
                store_traces(store, [t])
    out = {"import_s": timed(add)}
    out["list_s"] = timed(lambda: store.list(), repeat=5)
    out["list_tag_s"] = timed(lambda: store.list(tags=["copy=3"]), repeat=5)
    out["traces"] = len(store.trace_ids())
    store.close()
    return out


def store_interleaved(refs: dict[str, str], copies: int) -> dict:
    """Each parsed trace stored (store_traces: a transaction and its summary) into every store in turn, timed
    one by one: the median per backend, so a burst of other work on the machine falls on both alike."""
    import statistics

    from alloctrace.traces.sources import read_file, store_traces
    from alloctrace.traces.store.store import open_store

    stores = {k: open_store(ref) for k, ref in refs.items()}
    read = [t for f in FILES for t in read_file(f)]
    took: dict[str, list[float]] = {k: [] for k in stores}
    for k in range(copies):
        for t in read:
            t.meta.tags = [f"again={k}"]
            for name, store in stores.items():
                t0 = time.perf_counter()
                store_traces(store, [t])
                took[name].append(time.perf_counter() - t0)
    for store in stores.values():
        store.close()
    return {name: statistics.median(v) for name, v in took.items()}


def history_at(ref: str, n: int) -> dict:
    """History answers at `n` tagged traces (two real files' graphs, stored 500 traces a transaction)."""
    from alloctrace.traces.regress.history import history
    from alloctrace.traces.sources import read_file
    from alloctrace.traces.store.schema import TraceMeta
    from alloctrace.traces.store.store import open_store

    store = open_store(ref)
    read = [t for f in FILES[:2] for t in read_file(f)]
    batch = []
    for i in range(n):
        t = read[i % len(read)]
        tags = [f"commit=c{i // 4:05d}", f"config=k{i % 2}", f"model=m{i % 3}"]
        batch.append((TraceMeta(**{**t.meta.__dict__, "tags": tags}), t.graphs, None))
        if len(batch) == 500 or i == n - 1:
            store.add_traces(batch)
            batch = []
    store.close()
    store = open_store(ref)  # a fresh process's store: nothing of the page read yet
    out = {"traces": len(store.trace_ids()),
           "history_cold_s": timed(lambda: history(store, [], offset=100)),
           "history_s": timed(lambda: history(store, []), repeat=5),
           "history_tag_s": timed(lambda: history(store, ["model=m1"]), repeat=5),
           "scan_s": timed(lambda: store.list(), repeat=2)}
    store.close()
    return out


def load(port: int, clients: int, seconds: float, ids: list[str], keep_alive: bool = True) -> dict:
    """Requests per second from `clients` clients, on kept-alive connections (the kernel spreads them over the
    workers as they connect) or each request on a fresh one, from a process of their own (bench/http_load.py:
    raw sockets, about a tenth of an HTTP library's CPU per request, which the answers do not pay for on a
    2-core machine); and that process's CPU."""
    paths = [p for tid in ids for p in (f"/api/traces/{tid}", "/api/traces?tag=copy=1",
                                        f"/api/traces/{tid}/graphs/0/memory-map?max_shapes=500")]
    args = json.dumps({"port": port, "seconds": seconds, "clients": clients, "paths": paths, "fresh": not keep_alive})
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "http_load.py"), args], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"the load failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout)


def _cpu_busy(since: tuple | None = None):
    """The machine's CPU counters (/proc/stat: busy and total jiffies), or, given earlier ones, how many cores
    were busy in between on average: whether a round ran out of cores or waited on something else."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    now = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))      # all but idle and iowait
    if since is None:
        return now
    return (now[0] - since[0]) / max(1, now[1] - since[1]) * (os.cpu_count() or 1)


def serve_rounds(url: str, ids: list[str], workers: list[int], args) -> dict:
    """Every worker count's server started and warmed at once, then measured in turn, --rounds times (a server
    not under load waits idle): each round's figures share the moment's load from other work on the machine.
    The ratio to the first worker count is taken per round; the figures are the rounds' medians."""
    import statistics

    servers = {n: serve(url, n) for n in workers}
    rps: dict[int, list[float]] = {n: [] for n in workers}
    busy: dict[int, list[float]] = {n: [] for n in workers}
    client_ms, loads = [], []
    try:
        for n, (_, base) in servers.items():
            load(int(base.rsplit(":", 1)[1]), args.clients, args.warmup, ids, not args.fresh)  # caches warm
        for _ in range(args.rounds):
            for n, (_, base) in servers.items():
                before = _cpu_busy()
                got = load(int(base.rsplit(":", 1)[1]), args.clients, args.seconds, ids, not args.fresh)
                busy[n].append(_cpu_busy(before))
                rps[n].append(got["rps"])
                client_ms.append(1000 * got["client_cpu_s"] / max(got["requests"], 1))
                loads.append(os.getloadavg()[0])
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGINT)
        for proc, _ in servers.values():
            proc.wait(30)
    out = {f"rps {n} workers": round(statistics.median(v), 1) for n, v in rps.items()}
    for n in workers[1:]:
        each = [b / a for a, b in zip(rps[workers[0]], rps[n])]
        out[f"rps ratio {n}/{workers[0]} workers"] = round(statistics.median(each), 2)
        out[f"rps ratio {n}/{workers[0]} workers, each round"] = [round(x, 2) for x in each]
    out["load client CPU per request, ms"] = round(statistics.median(client_ms), 3)
    for n in workers:
        out[f"cores busy with {n} workers (of {os.cpu_count()})"] = round(statistics.median(busy[n]), 2)
    out["load average (1 min) during the rounds"] = [round(min(loads), 1), round(max(loads), 1)]
    return out


def serve(ref: str, workers: int) -> tuple[subprocess.Popen, str]:
    from pgcluster import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "alloctrace", "serve", "--store", ref, "--port", str(port),
                             "--workers", str(workers)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/api/presets", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(proc.stderr.read().decode()[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=20, help="times each file is stored")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=4, help="load time per worker count and round")
    ap.add_argument("--rounds", type=int, default=5, help="times each worker count is measured, in turn")
    ap.add_argument("--warmup", type=float, default=5, help="unmeasured load first, per worker count")
    ap.add_argument("--import-rounds", type=int, default=5, help="times both stores are made and filled, in turn")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--fresh", action="store_true",
                    help="each request on a new connection (as curl in a loop) instead of kept-alive ones")
    ap.add_argument("--history-traces", type=int, default=10000, help="traces stored for the history figures")
    ap.add_argument("--parts", default="import,history,serve", help="which figures to measure")
    add_option(ap)
    args = ap.parse_args()
    from pgcluster import Cluster, drop_database, new_database, pg_bin

    cluster = None
    admin = os.environ.get("ALLOCTRACE_TEST_PG")
    if not admin:
        cluster = Cluster(pg_bin())
        admin = cluster.start()
    results: dict = {"cores": os.cpu_count()}
    parts = set(args.parts.split(","))
    figures = []
    try:
        url = new_database(admin)
        if "history" in parts:
            hist = new_database(admin)
            with tempfile.TemporaryDirectory() as tmp:
                results["history"] = {"sqlite": history_at(str(Path(tmp) / "h"), args.history_traces),
                                      "postgresql": history_at(hist, args.history_traces)}
            drop_database(admin, hist)
            for backend, h in results["history"].items():
                figures += [at_most(f"{backend}: history API at {h['traces']} traces ({what}), ms", h[k] * 1000,
                                    "ms", 200, baseline=f"a summary of every trace (store.list, what it read "
                                                        f"before): {h['scan_s'] * 1000:.0f} ms, "
                                                        f"{h[k] / h['scan_s']:.3f}x of it")
                            for k, what in (("history_cold_s", "a page first asked for"),
                                            ("history_s", "a page asked for again"), ("history_tag_s", "one tag"))]
        if "import" in parts or "serve" in parts:
            import statistics

            rounds: dict[str, list[float]] = {k: [] for k in ("import_s", "list_s", "list_tag_s")}
            with tempfile.TemporaryDirectory() as tmp:
                for r in range(args.import_rounds):  # a fresh store of each kind a round, the two in turn
                    if r:
                        drop_database(admin, url)
                        url = new_database(admin)
                    lite = import_and_list(str(Path(tmp) / f"s{r}"), args.copies)
                    pg = import_and_list(url, args.copies)
                    for k in rounds:
                        rounds[k].append(pg[k] / lite[k])
                results["sqlite"], results["postgresql"] = lite, pg  # the last round's
                each = store_interleaved({"sqlite": str(Path(tmp) / f"s{r}"), "postgresql": url}, args.copies)
            results["store one trace, median ms"] = {k: round(v * 1000, 3) for k, v in each.items()}
            results["store_one ratio pg/sqlite"] = round(each["postgresql"] / each["sqlite"], 2)
            figures.append(Figure("PostgreSQL store: one trace stored (median, the two stores in turn), ratio to "
                                  "SQLite", results["store_one ratio pg/sqlite"], "x",
                                  baseline=f"SQLite {each['sqlite'] * 1000:.2f} ms"))
            for k in ("import_s", "list_s", "list_tag_s"):
                results[f"{k} ratio pg/sqlite"] = round(statistics.median(rounds[k]), 2)
                results[f"{k} ratio pg/sqlite, each round"] = [round(x, 2) for x in rounds[k]]
            results["load average (1 min) after the import"] = round(os.getloadavg()[0], 1)
            figures += [Figure(f"PostgreSQL store: {what}, ratio to SQLite", results[f"{k} ratio pg/sqlite"], "x",
                               baseline=f"SQLite {lite[k]:.3f} s; median of {args.import_rounds} rounds "
                                        f"{results[f'{k} ratio pg/sqlite, each round']}")
                        for k, what in (("import_s", f"import {pg['traces']} traces"), ("list_s", "list"),
                                        ("list_tag_s", "list by tag"))]
        from alloctrace.traces.store.store import open_store
        s = open_store(url)
        ids = sorted(s.trace_ids())[:6]  # a working set the per-worker caches hold (8 graphs)
        s.close()
        if "serve" in parts:
            results.update(serve_rounds(url, ids, [int(x) for x in args.workers.split(",")], args))
        drop_database(admin, url)
    finally:
        if cluster:
            cluster.stop()
    print(json.dumps(results, indent=1))
    for fig in figures:
        print(f"{fig.figure}: {fig.text()}" + (f" ({fig.baseline})" if fig.baseline else ""))
    w = [int(x) for x in args.workers.split(",")] if "serve" in parts else []
    figures += [Figure(f"serve --workers {n} over PostgreSQL, {args.clients} clients: requests/s, ratio to {w[0]}",
                       results[f"rps ratio {n}/{w[0]} workers"], "x",
                       baseline=f"{results[f'rps {w[0]} workers']} requests/s with {w[0]}; median of "
                                f"{args.rounds} rounds {results[f'rps ratio {n}/{w[0]} workers, each round']}; "
                                f"{'a connection per request' if args.fresh else 'kept-alive connections'}; "
                                f"load average {results['load average (1 min) during the rounds']}; the load's "
                                f"client {results['load client CPU per request, ms']} ms CPU a request")
                for n in w[1:]]
    write(args.json, figures)


if __name__ == "__main__":
    main()
