"""The dashboard's HTTP server: the JSON API (api.py), the web/ pages and Plotly.js.

`create_app` opens the store once; handlers share it through a Context.
Errors a user can cause come back as 4xx with a JSON `detail`; an optional
token guards /api (header `Authorization: Bearer T`, `?token=T`, or the cookie
a page visit with `?token=T` sets, so the dashboard works behind a token).
Web pages on other sites cannot drive it (guard.py), and a full disk or an
exhausted file table is a 507 / 503, not a traceback.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import re
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from alloctrace.traces.errors import UserError
from alloctrace.traces.util import verbose
from alloctrace.server import paths
from alloctrace.server.assets import IMMUTABLE, REVALIDATE, Assets, respond
from alloctrace.server.api import ACCESS, TRACE_ID, router
from alloctrace.server.context import Context
from alloctrace.server.torch_api import is_torch_trace as torch_page_for, router as torch_router
from alloctrace.server.graphs import AnswerBudget, BudgetJSONResponse
from alloctrace.server.guard import OriginGuard, one_line_loop_errors, os_error_response
from alloctrace.server.mapjson_fast import MemoryMapFastPath
from alloctrace.server.threads import lend_threads
from alloctrace.server.upload import UploadError
from alloctrace.server.whatif_api import router as whatif_router
from alloctrace.server.regress_api import router as regress_router

LOG = logging.getLogger("alloctrace.server")

COOKIE = "alloctrace_token"
AUTHENTICATED = "alloctrace.authenticated"  # scope extension TokenGuard sets on page requests
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{1,256}$")  # what secrets.token_urlsafe makes: safe in URLs and cookies


def check_token(token: str | None) -> str | None:
    """A token must be URL-safe (it goes into a URL, a cookie and a header unencoded)."""
    if token is not None and not TOKEN_RE.match(token):
        raise UserError("the token must be 1-256 characters of A-Z a-z 0-9 _ - (e.g. from "
                        "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
    return token


def check_read_tokens(token: str | None, read_tokens) -> tuple[str, ...]:
    """Read-only tokens are URL-safe, differ from the write token, and need one (else writes are open)."""
    read_tokens = tuple(t for t in (read_tokens or ()) if t)
    if read_tokens and not token:
        raise UserError("read-only tokens need a write token as well (--token): else anyone could write")
    for t in read_tokens:
        check_token(t)
        if t == token:
            raise UserError("a read-only token must differ from the write token")
    return read_tokens


PAGES = {"/": "index.html", "/diff": "diff.html", "/replay": "replay.html", "/sweep": "sweep.html",
         "/preflight": "preflight.html",
         "/torch": "torch.html", "/whatif": "whatif.html", "/history": "history.html", "/docs": "apidocs.html"}
GUARDED = ("/api", "/openapi.json", "/docs")  # the API and its description need the token; other pages do not


def _not_found_type():
    try:
        from alloctrace.traces.store.store import NotFound
        return NotFound
    except ImportError:  # pragma: no cover - the store is part of the package
        return KeyError


class TokenGuard:
    """ASGI middleware: /api needs a token; a page opened with ?token= stores it in a cookie.

    `token` may do anything; each of `read_tokens` may only read (GET and HEAD: list, view, diff,
    compare, history): a change (upload, delete, replay) with one is a 403."""

    def __init__(self, app, token: str | None, read_tokens=()):
        self.app, self.token = app, token
        self.read_tokens = tuple(read_tokens or ())

    def _level(self, given: str | None) -> str | None:
        if given is None:
            return None
        g = given.encode()
        if hmac.compare_digest(g, self.token.encode()):
            return "write"
        if any(hmac.compare_digest(g, t.encode()) for t in self.read_tokens):
            return "read"
        return None

    async def __call__(self, scope, receive, send):
        if self.token is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        from_query = (query.get("token") or [None])[0]
        if scope["path"].startswith(GUARDED):
            auth = headers.get("authorization", "")
            bearer = auth[7:] if auth.lower().startswith("bearer ") else None
            cookie = _cookie(headers.get("cookie", ""), COOKIE)
            levels = {self._level(t) for t in (bearer, from_query, cookie)}
            if "write" in levels or ("read" in levels and scope.get("method", "GET") in ("GET", "HEAD")):
                scope.setdefault("extensions", {})[ACCESS] = "write" if "write" in levels else "read"
                if not scope["path"].startswith("/api") and from_query is not None and self._level(from_query):
                    send = _setting_cookie(send, from_query)  # /docs?token=T: its page then reads /openapi.json
                return await self.app(scope, receive, send)
            if "read" in levels:
                resp = JSONResponse({"detail": "this token may only read (list, view, diff); changes need a write "
                                               "token"}, status_code=403)
            else:
                resp = JSONResponse({"detail": "missing or wrong token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
            return await resp(scope, receive, send)
        cookie = _cookie(headers.get("cookie", ""), COOKIE)
        # a page answers a caller without a token as it answers any trace id (no telling which exist)
        scope.setdefault("extensions", {})[AUTHENTICATED] = bool(self._level(from_query) or self._level(cookie))
        if from_query is not None and self._level(from_query):
            return await self.app(scope, receive, _setting_cookie(send, from_query))
        return await self.app(scope, receive, send)


def _setting_cookie(send, token: str):
    """`send` that adds the token's cookie to the response, so the page's own API calls carry it."""
    async def send_with_cookie(message):
        if message["type"] == "http.response.start":
            cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            message = {**message, "headers": list(message.get("headers", [])) + [(b"set-cookie", cookie.encode("latin-1"))]}
        await send(message)
    return send_with_cookie


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def create_app(store_dir=None, token: str | None = None, max_upload_bytes: int = 2 * 1024 ** 3,
               web_dir=None, store=None, hosts: set[str] | None = None, limits=None, read_tokens=()) -> FastAPI:
    """The server for the store at `store_dir` (None: the default store). `store` may be
    an already open store instead. `hosts`: the names the Host header may carry (None: any;
    `alloctrace serve` passes the bound names); `limits`: the import caps (bounded_io.Limits);
    `read_tokens`: tokens that may only read (they need `token`, which may write)."""
    check_token(token)
    read_tokens = check_read_tokens(token, read_tokens)
    verbose.reset()
    if store is None:
        from alloctrace.traces.store.store import open_store
        store = open_store(store_dir)
    verbose.note("store", f"{store.kind} {store.path or ''}".strip())
    startup = list(verbose.lines())
    ctx = Context(store, max_upload_bytes, limits)
    web = paths.find_web_dir(web_dir)

    @asynccontextmanager
    async def lifespan(app):
        one_line_loop_errors(asyncio.get_running_loop())
        lend_threads(app.state)
        app.state.assets.warm()
        yield
        ctx.close()

    # /docs is the dashboard's own page over /openapi.json (no assets from another site: it works offline)
    app = FastAPI(title="alloctrace", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  default_response_class=BudgetJSONResponse,
                  description="Stored ggml graph-allocator traces: upload, browse, memory maps, diff, replay.")
    app.state.ctx = ctx
    app.state.web_dir = web
    app.include_router(router)
    app.include_router(torch_router)  # PyTorch memory snapshots
    app.include_router(whatif_router)  # caching-allocator what-if for PyTorch snapshots
    app.include_router(regress_router)  # compare and history, over tagged traces
    _errors(app)
    _pages(app, web)
    app.add_middleware(AnswerBudget)  # each answer's byte budget (graphs.py)
    app.add_middleware(MemoryMapFastPath, ctx=ctx)  # innermost: after the guards below
    if token:
        app.add_middleware(TokenGuard, token=token, read_tokens=read_tokens)
    app.add_middleware(OriginGuard, hosts=hosts)
    app.add_middleware(VerboseLog, startup=startup)  # outermost: its stage is the whole request
    return app


class VerboseLog:
    """At DEBUG, each request's facts and stage times to the `alloctrace.server` log: what `alloctrace -v`
    prints for a command (the store, budgets, reader, generation profile), one line each."""

    def __init__(self, app, startup: list[str]):
        self.app, self.startup = app, startup

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not LOG.isEnabledFor(logging.DEBUG):
            return await self.app(scope, receive, send)
        verbose.reset()
        try:
            with verbose.stage(f"{scope['method']} {scope['path']}"):
                await self.app(scope, receive, send)
        finally:
            for line in self.startup[:1] + verbose.lines():
                LOG.debug("%s", line)


def _errors(app: FastAPI):
    not_found = _not_found_type()

    @app.exception_handler(UploadError)
    async def upload_error(request: Request, exc: UploadError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(not_found)
    async def missing(request: Request, exc: Exception):
        msg = exc.args[0] if exc.args else "not found"
        return JSONResponse({"detail": str(msg)}, status_code=404)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError):
        if isinstance(exc, not_found):
            return await missing(request, exc)
        public = getattr(exc, "public", None)  # a database's user and host are for the log, not the answer
        if public:
            import logging
            logging.getLogger("alloctrace.server").warning("%s", exc)
        return JSONResponse({"detail": public or str(exc)}, status_code=getattr(exc, "status", 400))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        page = getattr(request.app.state, "not_found_page", None)
        path = request.url.path
        if exc.status_code == 404 and page is not None and not path.startswith(("/api", "/static", "/vendor")):
            return page(request)  # a mistyped or stale address: a page with a way back
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(OSError)
    async def os_error(request: Request, exc: OSError):
        return os_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": _plain(exc.errors())}, status_code=422)


def _plain(errors) -> list:
    """Validation errors without the offending input (it may be huge or binary)."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")} for e in errors]


def _pages(app: FastAPI, web: Path | None):
    plotly_js = paths.plotly_js()
    assets = Assets(web, plotly_js, _plotly_version() if plotly_js else "0")
    app.state.assets = assets

    def page(request: Request, file: str) -> Response:
        asset = assets.page(file)
        if asset is None:
            return JSONResponse({"detail": f"page {file} is not installed"}, status_code=404)
        return respond(request, asset, REVALIDATE)

    def page_route(file: str):
        def serve_page(request: Request) -> Response:
            return page(request, file)
        return serve_page

    for route, file in PAGES.items():
        app.add_api_route(route, page_route(file), methods=["GET"], include_in_schema=False)

    def not_found(request: Request) -> Response:
        """The dashboard's not-found page (it says what the link lacks, with a way back), or JSON for a client
        that does not take HTML."""
        asset = assets.page("notfound.html")
        if asset is None or "text/html" not in request.headers.get("accept", ""):
            return JSONResponse({"detail": "not found"}, status_code=404)
        return Response(asset.body, status_code=404, media_type=asset.media_type, headers={"Cache-Control": "no-store"})

    app.state.not_found_page = not_found

    @app.get("/traces/{trace_id}", include_in_schema=False)
    def trace_page(request: Request, trace_id: str):
        if not re.fullmatch(TRACE_ID.strip("^$"), trace_id):
            return not_found(request)
        known = (request.scope.get("extensions") or {}).get(AUTHENTICATED, True)  # True: no token to give
        if known and torch_page_for(request.app.state.ctx.store, trace_id):  # PyTorch snapshots: their own page
            return RedirectResponse(f"/torch?id={trace_id}", status_code=307)
        return page(request, "trace.html")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    @app.get("/vendor/{version}/plotly.min.js", include_in_schema=False)
    def plotly(request: Request, version: str | None = None):
        asset = assets.plotly()
        if asset is None:
            return JSONResponse({"detail": "plotly is not installed"}, status_code=404)
        if version is not None and version != assets.plotly_version:
            return JSONResponse({"detail": "no such plotly version"}, status_code=404)
        return respond(request, asset, IMMUTABLE if version else REVALIDATE)

    @app.get("/static/{path:path}", include_in_schema=False)
    def static(request: Request, path: str):
        head, _, rest = path.partition("/")
        versioned = head == assets.version and rest
        asset = assets.files.get(rest if versioned else path)
        if asset is None:
            return JSONResponse({"detail": "not found"}, status_code=404)
        return respond(request, asset, IMMUTABLE if versioned else REVALIDATE)


def _plotly_version() -> str:
    try:
        from importlib.metadata import version
        return version("plotly")
    except Exception:  # noqa: BLE001 - any failure only costs caching
        return "0"
