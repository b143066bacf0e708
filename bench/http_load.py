"""A cheap HTTP load: GET requests from one process, non-blocking sockets, no HTTP library.

The server's throughput is what a benchmark measures; on a 2-core machine the load's own CPU is taken from the
server's second core. An asyncio httpx client spent about 2.3 ms of CPU per request (as much as the server
spent answering it), so `--workers 2` could not gain: this one spends a tenth of that. It prints what it spent
(`client_cpu_s`), so a figure can say.

    python bench/http_load.py '{"port": 8000, "seconds": 5, "clients": 50, "paths": ["/api/traces"],
                                "fresh": true}'

`clients` connections each send one request at a time, a path picked at random from `paths`; `fresh`: each
request on a new connection (the kernel spreads new connections over the server's workers), else keep-alive.
Any answer but a 200 stops it (exit 1, the status line and path on stderr). Prints one JSON line:
`{"requests", "seconds", "rps", "client_cpu_s"}`.
"""
from __future__ import annotations

import json
import random
import resource
import selectors
import socket
import sys
import time


class Conn:
    """One client's connection: the request it sent and the answer read so far."""

    def __init__(self):
        self.sock: socket.socket | None = None
        self.path = b""
        self.buf = b""
        self.need: int | None = None  # the whole answer's length, once its head is read


def run(port: int, seconds: float, clients: int, paths: list[str], fresh: bool = True, seed: int = 1) -> dict:
    sel = selectors.DefaultSelector()
    rng = random.Random(seed)
    requests = [(p.encode(), f"GET {p} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()) for p in paths]
    done = 0

    def connect(c: Conn):
        c.sock = socket.socket()
        c.sock.setblocking(False)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            c.sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        sel.register(c.sock, selectors.EVENT_WRITE, c)

    def send(c: Conn):
        c.path, request = rng.choice(requests)
        c.sock.sendall(request)
        c.buf, c.need = b"", None
        sel.modify(c.sock, selectors.EVENT_READ, c)

    def again(c: Conn):
        sel.unregister(c.sock)
        c.sock.close()
        connect(c)

    for _ in range(clients):
        connect(Conn())
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        for key, events in sel.select(timeout=0.2):
            c = key.data
            if events & selectors.EVENT_WRITE:
                send(c)
                continue
            data = c.sock.recv(1 << 20)
            if not data:  # the server closed a kept-alive connection: a new one
                again(c)
                continue
            c.buf += data
            if c.need is None:
                end = c.buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                head = c.buf[:end].decode("latin-1").split("\r\n")
                if head[0].split(" ")[1:2] != ["200"]:
                    sys.exit(f"{c.path.decode()}: {head[0]}")
                length = next((int(v) for k, _, v in (h.partition(":") for h in head[1:])
                               if k.strip().lower() == "content-length"), 0)
                c.need = end + 4 + length
            if len(c.buf) >= c.need:
                done += 1
                if fresh:
                    again(c)
                else:
                    send(c)
    took = time.monotonic() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"requests": done, "seconds": took, "rps": done / took, "client_cpu_s": usage.ru_utime + usage.ru_stime}


if __name__ == "__main__":
    a = json.loads(sys.argv[1])
    print(json.dumps(run(a["port"], a["seconds"], a["clients"], a["paths"], a.get("fresh", True))))
