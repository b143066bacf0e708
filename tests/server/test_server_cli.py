"""`alloctrace serve` as a user runs it: a real process, a real port, the example traces."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from alloctrace.cli import main
from conftest import free_port


@pytest.fixture()
def serve(tmp_path):
    procs = []

    def start(*args, env=None):
        port = free_port()
        p = subprocess.Popen([sys.executable, "-m", "alloctrace", "serve", "--store", str(tmp_path / "store"),
                              "--port", str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, **(env or {})})
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise AssertionError(f"serve exited {p.returncode}: {p.stderr.read()}")
            try:
                httpx.get(url + "/openapi.json", timeout=2)
                return p, url
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError("serve did not answer")

    yield start
    for p in procs:
        p.terminate()
        p.wait(30)


def test_serve_with_examples_and_restart(serve):
    p, url = serve("--examples")
    traces = httpx.get(url + "/api/traces").json()["traces"]
    assert len(traces) == 3
    assert httpx.get(url + "/").status_code == 200
    p.terminate()
    p.wait(30)
    _, url = serve("--examples")  # a store with traces is not seeded again
    assert httpx.get(url + "/api/traces").json()["traces"] == traces


def test_serve_token_from_environment(serve):
    _, url = serve(env={"ALLOCTRACE_TOKEN": "t0k"})
    assert httpx.get(url + "/api/traces").status_code == 401
    assert httpx.get(url + "/api/traces", headers={"Authorization": "Bearer t0k"}).status_code == 200


def test_busy_port_is_one_clear_line(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["serve", "--store", str(tmp_path), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: cannot serve on 127.0.0.1") and err.count("\n") == 1
