"""What keeps a loopback server safe from web pages and from slow or vanishing clients.

- `OriginGuard` (ASGI middleware): the `Host` header must name the server (a DNS
  rebinding page sends its own name, so it is refused with 403), and so must the
  authority of an absolute-form request target (`GET http://evil.example/...`,
  which HTTP says wins over the Host header), and a request
  that changes the store is refused with 403 when a browser marks it as coming
  from another site (`Origin` not this server, or `Sec-Fetch-Site: cross-site`
  / `same-site`). Clients that send no `Origin` (curl, scripts, the CLI) are not
  browsers driven by a page and keep working without a token.
- `slow_client_protocol`: a connection must finish a request's headers within
  `HEADER_TIMEOUT_S`, so idle or slowloris connections are closed instead of
  holding file descriptors forever (bodies have their own idle timeout in
  upload.py).
- `one_line_loop_errors`: the event loop's own errors (a client that vanished,
  no file descriptors left for `accept`) are logged as one line, not a traceback.
"""
from __future__ import annotations

import errno
import logging
import os
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse

HEADER_TIMEOUT_S = float(os.environ.get("ALLOCTRACE_HEADER_TIMEOUT_S") or 20.0)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger("alloctrace.server")


def allowed_hosts(bound: str) -> set[str] | None:
    """The names a browser may use for a server bound to `bound`; None: any (a wildcard bind,
    which is only allowed with a token)."""
    host = bound.strip("[]").lower()
    if host in ("0.0.0.0", "::", ""):
        return None
    names = {host}
    if host in LOOPBACK_NAMES or host.startswith("127."):
        names.update(LOOPBACK_NAMES)
    return names


def _host_name(value: str) -> str:
    """'example.com:8000' -> 'example.com'; '[::1]:8000' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class OriginGuard:
    """ASGI middleware: 403 for foreign Host headers and for cross-site state changes."""

    def __init__(self, app, hosts: set[str] | None = None):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        target = request_target(scope)
        why = None
        if self.hosts is not None and _host_name(host) not in self.hosts:
            why = "the Host header does not name this server"
        elif self.hosts is not None and target is not None and _host_name(urlsplit(target).netloc) not in self.hosts:
            why = "the request target names another host"
        elif scope.get("method", "GET") not in SAFE_METHODS:
            origin = headers.get("origin")
            site = headers.get("sec-fetch-site", "").lower()
            if site in ("cross-site", "same-site"):
                why = "a page on another site may not change this store"
            elif origin is not None and not _same_origin(origin, host):
                why = "a page on another origin may not change this store"
        if why is not None:
            log.warning("refused %s %s: %s", scope.get("method"), scope.get("path"), why)
            return await JSONResponse({"detail": f"forbidden: {why}"}, status_code=403)(scope, receive, send)
        return await self.app(scope, receive, send)


TARGET = "alloctrace.request_target"  # scope extension: the request line's target when in absolute form


def request_target(scope) -> str | None:
    """The request line's target when it is in absolute form (`http://host/path`), else None. uvicorn's
    httptools parser keeps only the path, so the protocol below saves the whole target; h11 leaves it in
    the path itself."""
    saved = (scope.get("extensions") or {}).get(TARGET)
    if saved:
        return saved
    raw = scope.get("raw_path") or b""
    return raw.decode("latin-1") if _absolute(raw) else None


def _absolute(target: bytes) -> bool:
    head = target[:16].lower()
    return head.startswith((b"http://", b"https://", b"ws://", b"wss://"))


def _same_origin(origin: str, host: str) -> bool:
    if origin == "null":
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower()


def slow_client_protocol(base, header_timeout_s: float = HEADER_TIMEOUT_S):
    """`base` (uvicorn's HTTP protocol class) with a deadline for each request's headers."""

    class SlowClientTimeout(base):
        _header_timer = None

        def on_headers_complete(self):
            url = getattr(self, "url", b"")  # httptools: the whole request target, before it keeps the path
            if _absolute(url) and getattr(self, "scope", None) is not None:
                self.scope.setdefault("extensions", {})[TARGET] = url.decode("latin-1")
            super().on_headers_complete()

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def _arm(self):
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._deadline)

        def _disarm(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _deadline(self):
            self._header_timer = None
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and not self.transport.is_closing():
                log.info("closed a connection that sent no complete request in %gs", header_timeout_s)
                self.transport.close()

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

    return SlowClientTimeout


def one_line_loop_errors(loop):
    """Log the event loop's errors (EMFILE on accept, resets) as one line each."""

    def handler(loop, context):
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            log.warning("out of file descriptors: new connections wait (%s)", exc.strerror)
        elif isinstance(exc, (ConnectionError, TimeoutError)):
            log.info("client connection ended: %s", exc)
        else:
            log.error("%s%s", context.get("message", "event loop error"), f": {exc!r}" if exc else "")

    loop.set_exception_handler(handler)


def os_error_response(exc: OSError) -> JSONResponse:
    """File descriptors or disk space ran out while answering: 503 / 507 instead of a 500 traceback."""
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        log.warning("out of file descriptors while answering a request")
        return JSONResponse({"detail": "the server is out of file descriptors; try again shortly"},
                            status_code=503, headers={"Retry-After": "5"})
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        log.warning("disk full while answering a request")
        return JSONResponse({"detail": "disk full: nothing was stored"}, status_code=507)
    log.error("I/O error: %s", exc)
    return JSONResponse({"detail": f"I/O error: {exc.strerror or exc}"}, status_code=500)
