"""The server's answers give nothing away: an absolute-form request line naming another host is refused like
a foreign Host header, and a trace page answers a caller without the token the same for every trace."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.server.app import create_app
from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "tests" / "data" / "hostile" / "gpt-2_tiny_short.AT.log"
TORCH = ROOT / "tests" / "data" / "torch" / "small_default.pickle.gz"


def raw_get(port: int, target: str, host: str) -> int:
    """The status of one request sent byte for byte (no client library rewrites the target)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.fixture
def server(tmp_path):
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "alloctrace", "serve", "--store", str(tmp_path / "s"), "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                raw_get(port, "/api/traces", f"127.0.0.1:{port}")
                break
            except OSError:
                if p.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"serve did not start: {p.stderr.read() if p.poll() is not None else ''}")
                time.sleep(0.2)
        yield port
    finally:
        p.terminate()
        p.wait(30)


def test_an_absolute_form_target_naming_another_host_is_refused(server):
    port = server
    here = f"127.0.0.1:{port}"
    assert raw_get(port, "/api/traces", here) == 200
    assert raw_get(port, f"http://{here}/api/traces", here) == 200  # absolute form naming this server: fine
    assert raw_get(port, "http://evil.example/api/traces", here) == 403  # before: 200
    assert raw_get(port, "http://evil.example:80/api/traces", "evil.example") == 403


def test_a_trace_page_answers_a_caller_without_the_token_the_same_for_every_trace(tmp_path):
    with TestClient(create_app(store_dir=tmp_path / "s", token="t0k")) as c:
        auth = {"Authorization": "Bearer t0k"}
        ggml = c.post("/api/traces", files={"file": ("g.log", GPT2.read_bytes())}, headers=auth).json()
        torch = c.post("/api/torch/traces", files={"file": ("t.pickle.gz", TORCH.read_bytes())}, headers=auth).json()
        g, t = ggml["traces"][0]["id"], torch["traces"][0]["id"]
        c.cookies.clear()
        answers = [c.get(f"/traces/{i}", follow_redirects=False) for i in (g, t, "0000ffff")]
        assert [r.status_code for r in answers] == [200] * 3  # before: 307 for the PyTorch one
        assert answers[0].content == answers[1].content == answers[2].content
        # with the token the PyTorch trace still opens its own page
        r = c.get(f"/traces/{t}?token=t0k", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == f"/torch?id={t}"
