"""`alloctrace serve --workers N` over a PostgreSQL store: uploads, lists and deletes from many clients
spread over the workers are stored exactly once, and no worker answers from a cache after another
worker deleted the trace. With SQLite, --workers > 1 is refused in one line."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from alloctrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
LOG = DATA / "explain" / "llama-tiny_c512_ub8.head.AT.log.gz"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(store: str, *args: str):
    """`alloctrace serve` in a process of its own; (process, base URL) once it answers."""
    port = _port()
    proc = subprocess.Popen([sys.executable, "-m", "alloctrace", "serve", "--store", store, "--port", str(port),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url + "/api/presets", timeout=5).status_code in (200, 401):
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)


def stop(proc):
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def fresh(url: str) -> httpx.Client:
    """A client that opens a new connection per request, so requests spread over the workers."""
    return httpx.Client(base_url=url, timeout=120, limits=httpx.Limits(max_keepalive_connections=0))


def test_sqlite_refuses_more_than_one_worker(tmp_path, capsys):
    assert main(["serve", "--store", str(tmp_path / "s"), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: --workers > 1 needs a PostgreSQL store") and err.count("\n") == 1


def workers_of(proc) -> list[int]:
    """The worker processes uvicorn started (children of `serve` running multiprocessing's spawn)."""
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return [int(k) for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


def test_two_workers_eight_clients_upload_list_delete(pg_url):
    proc, url = serve(pg_url, "--workers", "2")
    try:
        assert len(workers_of(proc)) == 2
        data = LOG.read_bytes()

        def client_work(k: int) -> dict:
            ids = {}
            with fresh(url) as c:
                for j in range(3):
                    name = f"client{k}-upload{j}"
                    r = c.post("/api/traces", files={"file": (LOG.name, data)}, data={"name": name,
                                                                                       "tag": f"client={k}"})
                    assert r.status_code == 201, r.text
                    ids[name] = r.json()["traces"][0]["id"]
                    assert c.get("/api/traces", params={"tag": f"client={k}"}).status_code == 200
                gone = ids.pop(f"client{k}-upload0")
                for _ in range(6):  # its map cached on both workers, most likely
                    r = c.get(f"/api/traces/{gone}/graphs/0/memory-map")
                assert r.status_code == 200, r.text[:500]
                assert c.delete(f"/api/traces/{gone}").status_code == 200
                for _ in range(6):  # whichever worker answers: gone
                    assert c.get(f"/api/traces/{gone}").status_code == 404
                    assert c.get(f"/api/traces/{gone}/graphs/0/memory-map").status_code == 404
                    mine = c.get("/api/traces", params={"tag": f"client={k}"}).json()["traces"]
                    assert sorted(t["id"] for t in mine) == sorted(ids.values())
            return ids

        with ThreadPoolExecutor(8) as pool:
            kept = {}
            for ids in pool.map(client_work, range(8)):
                kept.update(ids)
        with fresh(url) as c:
            listed = c.get("/api/traces").json()["traces"]
        assert sorted(t["name"] for t in listed) == sorted(kept)  # each upload stored exactly once
        assert sorted(t["id"] for t in listed) == sorted(kept.values())
    finally:
        stop(proc)
    assert proc.returncode == 0 or proc.returncode == -signal.SIGINT


def test_workers_share_the_token_rules(pg_url):
    proc, url = serve(pg_url, "--workers", "2", "--token", "w-token", "--read-token", "r-token")
    try:
        with fresh(url) as c:
            for _ in range(4):
                assert c.get("/api/traces").status_code == 401
                assert c.get("/api/traces", headers={"Authorization": "Bearer r-token"}).status_code == 200
                r = c.post("/api/traces", files={"file": (LOG.name, LOG.read_bytes())},
                           headers={"Authorization": "Bearer r-token"})
                assert r.status_code == 403
    finally:
        stop(proc)
