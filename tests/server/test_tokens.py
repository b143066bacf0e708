"""Tokens: the write token may do anything; read-only tokens may list, view, diff, compare and see
history, and get a 403 for uploads, deletes and replays; a page opened with a token keeps it."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.errors import UserError

LOG = Path(__file__).resolve().parents[1] / "data" / "explain" / "llama-tiny_c512_ub8.head.AT.log.gz"


def bearer(t):
    return {"Authorization": f"Bearer {t}"}


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(tmp_path / "s", token="writer", read_tokens=["reader", "viewer2"])) as c:
        yield c


def test_read_tokens_read_and_write_tokens_write(client):
    with open(LOG, "rb") as f:
        up = client.post("/api/traces", files={"file": (LOG.name, f)}, data={"tag": "commit=a"},
                         headers=bearer("reader"))
    assert up.status_code == 403 and "only read" in up.json()["detail"]
    with open(LOG, "rb") as f:
        up = client.post("/api/traces", files={"file": (LOG.name, f)}, data={"tag": "commit=a"},
                         headers=bearer("writer"))
    assert up.status_code == 201
    tid = up.json()["traces"][0]["id"]
    for t in ("reader", "viewer2", "writer"):
        assert client.get("/api/traces", headers=bearer(t)).json()["traces"][0]["id"] == tid
        assert client.get(f"/api/traces/{tid}/graphs/0/events", headers=bearer(t)).status_code == 200
        assert client.get(f"/api/diff?a={tid}:0&b={tid}:1", headers=bearer(t)).status_code == 200
        assert client.get("/api/history?tag=commit=a", headers=bearer(t)).status_code == 200
    for t in (None, "wrong"):
        assert client.get("/api/traces", headers=bearer(t) if t else {}).status_code == 401
    assert client.delete(f"/api/traces/{tid}", headers=bearer("reader")).status_code == 403
    assert client.post("/api/replay", json={"preset": "llama-7b", "profile": "ggml-head"},
                       headers=bearer("viewer2")).status_code == 403
    assert client.get(f"/api/traces/{tid}", headers=bearer("reader")).status_code == 200  # still there
    assert client.delete(f"/api/traces/{tid}", headers=bearer("writer")).status_code == 200


def test_a_page_opened_with_a_read_token_keeps_it_in_a_cookie(client):
    page = client.get("/", params={"token": "reader"})
    assert page.status_code == 200 and "alloctrace_token=reader" in page.headers["set-cookie"]
    assert client.get("/api/traces").status_code == 200  # the cookie
    assert client.delete("/api/traces/00000000").status_code == 403  # ... may only read


def test_bad_token_settings_are_refused(tmp_path, capsys):
    with pytest.raises(UserError, match="need a write token"):
        create_app(tmp_path / "s", read_tokens=["reader"])
    with pytest.raises(UserError, match="must differ"):
        create_app(tmp_path / "s", token="same", read_tokens=["same"])
    assert main(["serve", "--store", str(tmp_path / "s"), "--read-token", "bad token!", "--token", "x"]) == 2
    assert "token must be" in capsys.readouterr().err


def test_the_access_answer_says_who_may_change_the_store(client):
    assert client.get("/api/access", headers=bearer("writer")).json() == {"can_write": True, "why": None}
    assert client.get("/api/access", headers=bearer("reader")).json() == {"can_write": False,
                                                                          "why": "read-only token"}


def test_a_read_token_never_sees_upload_or_delete_controls(tmp_path, page):
    """The dashboard opened with a read token: no upload panel, no delete buttons, no drop hint; with the
    write token all of them."""
    from conftest import live_server

    store = tmp_path / "s"
    assert main(["import", str(LOG), "--store", str(store)]) == 0
    with live_server(store, token="writer", read_tokens=["reader"]) as url:
        page.goto(f"{url}/?token=reader")
        page.wait_for_selector("tr[data-id] a.trace-name")
        page.wait_for_load_state("networkidle")
        assert page.locator("#drop").is_hidden() and page.locator(".drop-hint").is_hidden()
        assert page.locator("button.danger").count() == 1 and page.locator("button.danger").is_hidden()
        assert not page.evaluate("document.body.classList.contains('can-write')")
        page.goto(f"{url}/?token=writer")
        page.wait_for_selector("button.danger", state="visible")
        assert page.locator("#drop").is_visible() and page.locator(".drop-hint").is_visible()
