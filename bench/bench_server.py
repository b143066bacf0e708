"""Latency of memory-map and state requests on a 1M-event trace.

Builds a store holding one synthetic million-event graph (or reuses --store DIR),
runs `alloctrace serve` on a free loopback port in its own process, and drives it
from an asyncio load generator: each client asks for random view windows (whole
graph, zoomed in, zoomed far in) until the request budget or the time limit runs out.
Then the state endpoint: the first request at a late event, then random events (each
from the nearest state checkpoint: kept in the store for a long graph, else made on the
way by the first request). The first memory-map request comes before all of that (it
loads the graph's columns and lifetimes, as the dashboard's first view does); with
--state-cold a server started first answers state requests before anything else on the
graph (a deep link to the state view: nothing of the graph in its caches), then the run
goes on as without it.

    python bench/bench_server.py [--events 1000000] [--clients 50] [--requests 2000] [--seconds 90]
                                 [--state-requests 30] [--state-first N] [--state-cold] [--upload-mb 20]
                                 [--no-map] [--no-state] [--json PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from figures import Figure, add_option, at_most, write  # noqa: E402

FIGURES: list[Figure] = []


def build_store(path: Path, n_events: int) -> str:
    from test_memmap import synthetic_events  # the same generator the tests use

    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    from alloctrace.traces.store.store import open_store
    store = open_store(path)
    for t in store.list():
        if t["name"] == f"bench {n_events}":
            return t["id"]
    t0 = time.perf_counter()
    events = synthetic_events(n_events, seed=1)
    tid = store.add_trace(TraceMeta(f"bench {n_events}", "synthetic", "ggml-head"),
                          [GraphRecord(0, "reserve", events, max_size=4096 << 20)])
    print(f"built and stored {n_events} events in {time.perf_counter() - t0:.1f} s")
    store.close()
    return tid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(store: Path, port: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "alloctrace", "serve", "--store", str(store), "--port", str(port)],
                         stdout=subprocess.DEVNULL, env={**os.environ, "ALLOCTRACE_TOKEN": ""})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=2)
            return p
        except httpx.TransportError:
            time.sleep(0.2)
    p.kill()
    raise SystemExit("server did not start")


def random_window(rng: random.Random, n: int, top: int) -> dict:
    zoom = rng.choice([1, 1, 10, 100, 1000])
    width = max(1, n // zoom)
    x0 = rng.randrange(0, n - width + 1)
    height = max(1, top // rng.choice([1, 1, 4, 16]))
    y0 = rng.randrange(0, top - height + 1)
    return {"x0": x0, "x1": x0 + width, "y0": y0, "y1": y0 + height, "max_shapes": 2000, "max_points": 1000}


class Connection:
    """One keep-alive HTTP/1.1 connection doing GETs: the load generator's client. Much lighter than a
    general client, so the machine's CPU goes to the server under test, not to making requests."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def get(self, target: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"GET {target} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length")
        return status, await self.reader.readexactly(length)

    def close(self):
        if self.writer is not None:
            self.writer.close()


async def load(url: str, clients: int, budget: int, seconds: float, n: int, top: int):
    latencies, errors, sizes = [], 0, []
    remaining = [budget]
    stop_at = time.perf_counter() + seconds
    parts = httpx.URL(url)

    async def worker(k):
        nonlocal errors
        rng = random.Random(k)
        conn = Connection(parts.host, parts.port)
        try:
            while remaining[0] > 0 and time.perf_counter() < stop_at:
                remaining[0] -= 1
                target = f"{parts.raw_path.decode()}memory-map?{urlencode(random_window(rng, n, top))}"
                t0 = time.perf_counter()
                try:
                    status, body = await conn.get(target)
                except (OSError, asyncio.IncompleteReadError, StopIteration) as e:
                    errors += 1
                    print(f"client {k}: {type(e).__name__}: {e}", file=sys.stderr)
                    conn.close()
                    conn = Connection(parts.host, parts.port)
                    continue
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    errors += 1
                else:
                    sizes.append(len(body))
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    return latencies, errors, sizes, wall


def state_bench(base: str, n: int, count: int, first_event: int | None = None, cold: bool = False,
                pid: int | None = None):
    """First state request at 90% of the graph (or `first_event`), then `count` random events, one at a time.
    `cold`: the state request is the server's first on the graph (else the memory map came first);
    `pid`: the server's, to report the CPU time the first request took (all its threads)."""
    at = n * 9 // 10 if first_event is None else first_event
    what = "the server's first request on the graph" if cold else "first state request, after the memory map"
    with httpx.Client(timeout=600) as client:
        cpu0 = cpu_seconds(pid) if pid else 0.0
        t0 = time.perf_counter()
        r = client.get(base + "state", params={"event": at})
        first = time.perf_counter() - t0
        cpu = f", server CPU {(cpu_seconds(pid) - cpu0) * 1000:.0f} ms" if pid else ""
        r.raise_for_status()
        print(f"{what} (state at event {at}): {first * 1000:.0f} ms{cpu}, {len(r.json()['live'])} live tensors")
        FIGURES.append(at_most(f"state: {what}, at a late event, {n:,} events", first * 1000, "ms", 100))
        rng = random.Random(7)
        lat = []
        for _ in range(count):
            t0 = time.perf_counter()
            client.get(base + "state", params={"event": rng.randrange(n + 1)}).raise_for_status()
            lat.append(time.perf_counter() - t0)
    lat.sort()
    if lat:
        print(f"{count} random state requests: p50 {pct(lat, 0.5) * 1000:.0f} ms  max {lat[-1] * 1000:.0f} ms")
        after = "after a cold first" if cold else "after the first"
        FIGURES.append(at_most(f"state: random events {after}, {n:,} events, max", lat[-1] * 1000, "ms", 100))


def upload_bench(url: str, store: Path, mb: int):
    """Upload a big log (a fixture repeated) and list the traces every 50 ms until it is stored;
    the uploaded trace is deleted again."""
    import threading
    fixture = Path(os.environ.get("ALLOCTRACE_FIXTURES", Path(__file__).resolve().parents[1] / "tests" / "data"
                                  / "ggml-real")) / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"
    data = fixture.read_bytes()
    path = store / "bench-upload.log"
    path.write_bytes(data * max(1, (mb << 20) // len(data)))
    size_mb = path.stat().st_size / (1 << 20)
    done = {}

    def send():
        t0 = time.perf_counter()
        with open(path, "rb") as f:
            r = httpx.post(url, files={"file": ("big.log", f)}, data={"name": "bench upload"}, timeout=3600)
        done["status"], done["seconds"], done["body"] = r.status_code, time.perf_counter() - t0, r.json()

    t = threading.Thread(target=send)
    t.start()
    lat = []
    with httpx.Client(timeout=3600) as client:
        while t.is_alive():
            t0 = time.perf_counter()
            client.get(url).raise_for_status()
            lat.append(time.perf_counter() - t0)
            time.sleep(0.05)
        t.join()
        for tr in done.get("body", {}).get("traces", []):
            client.delete(f"{url}/{tr['id']}")
    path.unlink()
    lat.sort()
    print(f"upload of {size_mb:.0f} MB: status {done.get('status')}, {done.get('seconds', 0):.1f} s; "
          f"{len(lat)} trace listings meanwhile, p50 {pct(lat, 0.5) * 1000:.0f} ms  max {lat[-1] * 1000:.0f} ms")
    FIGURES.append(Figure(f"trace listing during a {size_mb:.0f} MB upload, max", round(lat[-1] * 1000), "ms",
                          baseline=f"the upload itself: {done.get('seconds', 0):.1f} s"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory so far (Linux /proc; 0 elsewhere)."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0.0
    return int(line.split()[1]) / 1024


def pct(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=2000, help="request budget")
    ap.add_argument("--seconds", type=float, default=90, help="time limit for the load phase")
    ap.add_argument("--store", help="store directory to build in / reuse (default: a temp dir)")
    ap.add_argument("--state-requests", type=int, default=30, help="random state requests after the first")
    ap.add_argument("--no-map", action="store_true", help="skip the memory-map load phase")
    ap.add_argument("--no-state", action="store_true", help="skip the state requests")
    ap.add_argument("--state-first", type=int, help="event of the first state request (default: 90%% of the graph)")
    ap.add_argument("--state-cold", action="store_true",
                    help="first, on a server of its own, state requests before any other request on the graph")
    ap.add_argument("--upload-mb", type=int, default=20, help="size of the log uploaded while reads go on (0: skip)")
    add_option(ap)
    args = ap.parse_args()

    store = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="bench-server-"))
    tid = build_store(store, args.events)
    if args.state_cold:
        port = free_port()
        server = start_server(store, port)
        try:
            state_bench(f"http://127.0.0.1:{port}/api/traces/{tid}/graphs/0/", args.events, args.state_requests,
                        args.state_first, cold=True, pid=server.pid)
            print(f"server peak RSS after the cold state requests: {peak_rss_mb(server.pid):.0f} MB")
        finally:
            server.terminate()
            server.wait(30)
    port = free_port()
    server = start_server(store, port)
    try:
        base = f"http://127.0.0.1:{port}/api/traces/{tid}/graphs/0/"
        t0 = time.perf_counter()
        first = httpx.get(base + "memory-map", timeout=300).json()
        t_first = time.perf_counter() - t0
        print(f"first memory-map (lifetimes and pyramid: stored with the graph, else built): {t_first:.2f} s, "
              f"{first['total_in_view']} lifetimes, {first['count']} shapes sent")
        FIGURES.append(Figure(f"memory map: first request, {args.events:,} events (load, lifetimes, pyramid)",
                              round(t_first, 2), "s"))
        top = first["window"]["y1"]
        if not args.no_map:
            cpu0, client0 = cpu_seconds(server.pid), cpu_seconds(os.getpid())
            lat, errors, sizes, wall = asyncio.run(load(base, args.clients, args.requests, args.seconds,
                                                        args.events, top))
            cpu = cpu_seconds(server.pid) - cpu0
            client_cpu = cpu_seconds(os.getpid()) - client0
        if not args.no_state:
            state_bench(base, args.events, args.state_requests, args.state_first)
            print(f"server peak RSS so far: {peak_rss_mb(server.pid):.0f} MB")
        if args.upload_mb:
            upload_bench(f"http://127.0.0.1:{port}/api/traces", store, args.upload_mb)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    if args.no_map:
        write(args.json, FIGURES)
        return
    lat.sort()
    print(f"{len(lat)} memory-map requests, {args.clients} concurrent clients, {wall:.1f} s, "
          f"{len(lat) / wall:.1f} req/s, {errors} errors, mean response {sum(sizes) / max(1, len(sizes)) / 1024:.0f} KiB")
    print(f"server CPU {cpu:.1f} s, {cpu / max(1, len(lat)) * 1000:.1f} ms per request "
          f"(other load on the machine skews latency, not this); load generator CPU {client_cpu:.1f} s")
    print(f"latency p50 {pct(lat, 0.50) * 1000:.0f} ms  p90 {pct(lat, 0.90) * 1000:.0f} ms  "
          f"p99 {pct(lat, 0.99) * 1000:.0f} ms  max {lat[-1] * 1000:.0f} ms")
    what = f"memory map, {args.events:,} events, {args.clients} clients, {len(lat)} random windows"
    machine = f"load generator on the same machine: {client_cpu:.1f} s CPU; load average {os.getloadavg()[0]:.1f}"
    FIGURES[:0] = [at_most(f"{what}: server CPU per request", cpu / max(1, len(lat)) * 1000, "ms", 3),
                   at_most(f"{what}: p99 latency", pct(lat, 0.99) * 1000, "ms", 200, machine),
                   Figure(f"{what}: p50 latency", round(pct(lat, 0.50) * 1000), "ms", baseline=machine)]
    write(args.json, FIGURES)


if __name__ == "__main__":
    main()
