"""The dashboard's files: versioned immutable URLs, strong ETags, gzip, and only web/'s own files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.server.app import create_app

WEB = Path(__file__).resolve().parents[2] / "web"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with TestClient(create_app(store_dir=tmp_path_factory.mktemp("store"))) as c:
        yield c


def test_pages_name_versioned_assets_that_are_immutable(client):
    page = client.get("/traces/0123abcd")
    assert page.status_code == 200 and page.headers["cache-control"] == "no-cache"
    urls = re.findall(r'(?:src|href)="(/(?:static|vendor)/[^"]+)"', page.text)
    version = client.app.state.assets.version
    assert f"/static/{version}/trace.js" in urls and f"/static/{version}/style.css" in urls
    assert any(re.fullmatch(r"/vendor/[^/]+/plotly\.min\.js", u) for u in urls)
    for url in urls:
        r = client.get(url, headers={"Accept-Encoding": "identity"})
        assert r.status_code == 200, url
        assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert re.fullmatch(r'"[0-9a-f]{32}"', r.headers["etag"])  # strong: no W/
        if url.startswith("/static/"):
            assert r.content == (WEB / url.rsplit("/", 1)[1]).read_bytes()


@pytest.mark.parametrize("route, module", [("/", "home.js"), ("/diff", "diff.js"), ("/replay", "replay.js"),
                                           ("/sweep", "sweep.js"), ("/torch", "torch.js"),
                                           ("/whatif", "whatif-page.js")])
def test_every_page_loads_its_module_from_a_versioned_url(client, route, module):
    page = client.get(route)
    assert page.status_code == 200 and page.headers["cache-control"] == "no-cache"
    version = client.app.state.assets.version
    scripts = re.findall(r'<script[^>]*src="([^"]+)"', page.text)
    assert f"/static/{version}/{module}" in scripts
    assert all(s.startswith((f"/static/{version}/", "/vendor/")) for s in scripts), scripts


def test_modules_import_each_other_relatively_and_every_page_is_in_the_header():
    """A module imported by an absolute /static/ path would load unversioned (and twice: a second instance)."""
    for js in WEB.glob("*.js"):
        specs = re.findall(r'^\s*(?:import|export)\b[^;]*?\bfrom\s+"([^"]+)"', js.read_text(), re.M | re.S)
        assert all(s.startswith("./") for s in specs), (js.name, specs)
    nav = re.findall(r'href: "(/[a-z]*)"', (WEB / "common.js").read_text())
    from alloctrace.server.app import PAGES
    assert {"/", "/replay", "/sweep", "/torch"} <= set(nav) <= set(PAGES)


def test_the_version_is_a_digest_of_the_files(tmp_path):
    web = tmp_path / "web"
    web.mkdir()
    (web / "index.html").write_text('<script src="/static/a.js"></script>')
    (web / "a.js").write_text("export const a = 1;\n")
    first = create_app(store_dir=tmp_path / "s1", web_dir=web).state.assets.version
    assert create_app(store_dir=tmp_path / "s2", web_dir=web).state.assets.version == first
    (web / "a.js").write_text("export const a = 2;\n")
    assert create_app(store_dir=tmp_path / "s3", web_dir=web).state.assets.version != first


def test_gzip_and_revalidation(client):
    body = (WEB / "memmap.js").read_bytes()
    r = client.get("/static/memmap.js", headers={"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip" and r.headers["cache-control"] == "no-cache"
    assert r.content == body  # decoded by the client
    assert int(r.headers["content-length"]) < len(body) / 2  # what went over the wire
    again = client.get("/static/memmap.js", headers={"Accept-Encoding": "gzip", "If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    plain = client.get("/static/memmap.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.headers["etag"] != r.headers["etag"]
    plotly = client.get("/vendor/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert plotly.headers["content-encoding"] == "gzip" and int(plotly.headers["content-length"]) < 2_000_000


def test_only_web_files_are_served(client):
    version = client.app.state.assets.version
    for url in ("/static/../server/app.py", "/static/%2e%2e/pyproject.toml", f"/static/{version}/nope.js",
                "/static/0000000000/common.js/x", "/vendor/0.0.0/plotly.min.js"):
        assert client.get(url).status_code == 404, url



@pytest.mark.parametrize("route", ["/traces/0123abcd", "/torch?id=0123abcd"])
def test_pages_with_a_first_picture_preload_plotly_instead_of_blocking_on_it(client, route):
    """The trace view and the PyTorch page draw their first chart before Plotly.js runs: no parser-blocking
    script tag for it, a preload (same versioned URL) that web/common.js plotlyReady() runs later."""
    html = client.get(route).text
    assert not re.search(r"<script[^>]*plotly\.min\.js", html)
    link = re.search(r'<link rel="preload" as="script" href="(/vendor/[^"]+/plotly\.min\.js)" id="plotly-js">', html)
    assert link and client.get(link.group(1)).status_code == 200


def test_plotly_is_compressed_once_per_process(tmp_path):
    """Every app in a process shares one compressed copy of Plotly.js, and it decodes to the file."""
    apps = [create_app(store_dir=tmp_path / name) for name in ("a", "b")]
    with TestClient(apps[0]) as c:
        first = apps[0].state.assets.plotly()
        assert first is apps[1].state.assets.plotly()
        r = c.get(f"/vendor/{apps[0].state.assets.plotly_version}/plotly.min.js", headers={"Accept-Encoding": "gzip"})
        assert r.content == apps[0].state.assets.plotly_path.read_bytes()  # the compressed copy decodes to the file
        assert int(r.headers["content-length"]) == len(first.gzipped)


def test_pages_preload_their_whole_module_graph(client):
    """Every module a page's module imports, directly or not, is named in a modulepreload, so the browser fetches
    the graph at once; the list is derived from the import statements, here checked against the files."""
    version = client.app.state.assets.version
    html = client.get("/traces/0123abcd").text
    preloaded = set(re.findall(rf'<link rel="modulepreload" href="/static/{version}/([\w.-]+\.js)">', html))
    todo, graph = ["trace.js"], set()
    while todo:
        name = todo.pop()
        if name not in graph:
            graph.add(name)
            todo += re.findall(r'from\s+"\./([\w.-]+\.js)"', (WEB / name).read_text())
    assert {"memmap.js", "sketch.js", "common.js"} <= graph and preloaded == graph
