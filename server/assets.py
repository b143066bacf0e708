"""The dashboard's files over HTTP: gzip-compressed once, strong ETags, immutable versioned URLs.

Pages name their assets as /static/<version>/<file>, where <version> is a digest of every file in web/, so a
browser keeps them for good (Cache-Control: immutable) and a new release changes every URL at once; the
modules import each other by relative paths, so the version carries through. Plotly.js is
/vendor/<plotly version>/plotly.min.js. Pages and unversioned /static/<file> are revalidated by ETag (304).
Only files found under web/ at start are served (a request names a key of that table, never a path).
Plotly.js is compressed once per process, in the background as the server starts.
"""
from __future__ import annotations

import gzip
import hashlib
import mimetypes
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response

COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml")
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
IMPORT_RE = re.compile(r'(?:from|import)\s*"\./([\w.-]+\.js)"')  # a module's static imports of its siblings


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes | None  # None when compression does not pay (small or already compressed)
    etag: str  # strong: a digest of the bytes
    media_type: str


def _media_type(name: str) -> str:
    if name.endswith(".js"):
        return "text/javascript; charset=utf-8"
    if name.endswith(".html"):
        return "text/html; charset=utf-8"
    if name.endswith(".css"):
        return "text/css; charset=utf-8"
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def make_asset(body: bytes, name: str) -> Asset:
    media = _media_type(name)
    packed = None
    if len(body) > 1024 and media.startswith(COMPRESSIBLE):
        packed = gzip.compress(body, compresslevel=9, mtime=0)
        if len(packed) >= len(body) * 0.9:
            packed = None
    return Asset(body, packed, '"' + hashlib.sha256(body).hexdigest()[:32] + '"', media)


_PLOTLY: dict[tuple, Asset] = {}  # one compressed copy per process, shared by every app
_PLOTLY_LOCK = threading.Lock()


def plotly_asset(path: Path) -> Asset:
    """Plotly.js (4.6 MB; about 1.4 MB gzipped) read and compressed once per process: the half second of
    compression is paid at start (`Assets.warm`), not by the first page that asks for it."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _PLOTLY_LOCK:  # a request during the warm-up waits for it rather than compressing again
        if key not in _PLOTLY:
            _PLOTLY[key] = make_asset(path.read_bytes(), "plotly.min.js")
        return _PLOTLY[key]


class Assets:
    """web/'s files (read at start) and Plotly.js, with the version that goes into their URLs."""

    def __init__(self, web: Path | None, plotly_js: Path | None, plotly_version: str = "0"):
        self.files: dict[str, Asset] = {}
        if web is not None and web.is_dir():
            for p in sorted(web.rglob("*")):
                if p.is_file() and not p.name.startswith(".") and "__pycache__" not in p.parts:
                    rel = p.relative_to(web).as_posix()
                    self.files[rel] = make_asset(p.read_bytes(), rel)
        digest = hashlib.sha256()
        for rel, a in sorted(self.files.items()):
            digest.update(rel.encode() + b"\0" + a.etag.encode())
        self.version = digest.hexdigest()[:12]
        self.plotly_path, self.plotly_version = plotly_js, plotly_version
        self._plotly: Asset | None = None
        self._pages: dict[str, Asset] = {}

    def plotly(self) -> Asset | None:
        """Plotly.js, compressed (once per process)."""
        if self._plotly is None and self.plotly_path is not None:
            self._plotly = plotly_asset(self.plotly_path)
        return self._plotly

    def warm(self) -> None:
        """Compress Plotly.js in the background, so the first visitor does not wait for it."""
        if self.plotly_path is not None:
            threading.Thread(target=self.plotly, name="compress-plotly", daemon=True).start()

    def module_graph(self, entry: str) -> list[str]:
        """`entry` and every module it imports, directly or not, by relative path (web/ is flat)."""
        seen, todo = [], [entry]
        while todo:
            rel = todo.pop(0)
            if rel in seen or rel not in self.files:
                continue
            seen.append(rel)
            todo.extend(IMPORT_RE.findall(self.files[rel].body.decode("utf-8")))
        return seen

    def page(self, name: str) -> Asset | None:
        """An HTML page with its asset URLs versioned, and a modulepreload for every module its module
        imports: the browser fetches the whole graph at once instead of one level of imports at a time."""
        if name not in self._pages:
            src = self.files.get(name)
            if src is None:
                return None
            html = src.body.decode("utf-8")
            entries = re.findall(r'<script type="module" src="/static/([\w.-]+\.js)"></script>', html)
            preloads = "".join(f'  <link rel="modulepreload" href="/static/{rel}">\n'
                               for entry in entries for rel in self.module_graph(entry))
            html = html.replace("</head>", preloads + "</head>", 1)
            html = html.replace('"/static/', f'"/static/{self.version}/')
            html = html.replace('"/vendor/plotly.min.js"', f'"/vendor/{self.plotly_version}/plotly.min.js"')
            self._pages[name] = make_asset(html.encode("utf-8"), name)
        return self._pages[name]


def respond(request: Request, asset: Asset, cache: str) -> Response:
    """200 (gzipped when the client takes it) or 304 when the client's copy is current."""
    zipped = asset.gzipped is not None and "gzip" in request.headers.get("accept-encoding", "").lower()
    etag = asset.etag[:-1] + '-gzip"' if zipped else asset.etag  # each coding its own strong validator
    headers = {"ETag": etag, "Cache-Control": cache, "Vary": "Accept-Encoding"}
    given = {t.strip() for t in request.headers.get("if-none-match", "").split(",")}
    if etag in given or "*" in given:
        return Response(status_code=304, headers=headers)
    if zipped:
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)
