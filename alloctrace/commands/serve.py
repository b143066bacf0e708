"""`alloctrace serve`: the dashboard and its JSON API over the trace store."""
from __future__ import annotations

import ipaddress
import logging
import os
import resource
import secrets
import socket
import sys
import threading
import webbrowser
from pathlib import Path

from alloctrace.traces.errors import UserError

from ._common import examples

TOKEN_ENV = "ALLOCTRACE_TOKEN"
READ_TOKENS_ENV = "ALLOCTRACE_READ_TOKENS"
MAX_WORKERS = 64
EXAMPLES = """examples:
  alloctrace serve                                    # the default store, http://127.0.0.1:8000/
  alloctrace serve --store postgresql://alloc@db:5432/traces --workers 4 --host 0.0.0.0 \\
      --token auto --read-token "$DASHBOARD_TOKEN"     # a shared server for a team and its CI
  alloctrace serve --examples --open                  # the store gets the example traces it lacks"""


EXAMPLES = examples(
    'alloctrace serve --store ./store --open   # http://127.0.0.1:8000',
    'alloctrace serve --examples --port 8001   # the store gets the example traces it lacks',
    'alloctrace serve --host 0.0.0.0 --token "$TOKEN"   # reachable from other machines, behind a token')


def register(subparsers):
    import argparse

    p = subparsers.add_parser("serve", help="run the dashboard and HTTP API",
                              description="Serve the dashboard and the JSON API (/api, docs at /docs).",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", metavar="DIR|URL",
                   help="store directory or PostgreSQL URL postgresql://user@host:port/db "
                        "(default: $ALLOCTRACE_STORE or the user data dir)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--open", action="store_true", help="open the dashboard in a browser")
    p.add_argument("--token", help=f"require this token on /api (default: ${TOKEN_ENV}); "
                                   "required when binding a non-loopback address; `auto` makes a random one; "
                                   "only A-Z a-z 0-9 _ - are allowed")
    p.add_argument("--read-token", action="append", default=[], metavar="T", dest="read_tokens",
                   help=f"a token that may only read (list, view, diff, compare, history), repeatable "
                        f"(default: ${READ_TOKENS_ENV}, comma-separated); needs --token for writes")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="server processes (default 1); more than one needs a PostgreSQL store")
    p.add_argument("--examples", action="store_true", help="add the example traces the store lacks (never twice)")
    p.add_argument("--max-upload-mb", type=int, default=2048, metavar="MB", help="upload size cap (default 2048)")
    p.add_argument("--max-bytes", "--max-decompressed", dest="max_decompressed", metavar="BYTES",
                   help="refuse an upload that decompresses to more than this (e.g. 512M; default 64M for a "
                        "compressed file, none for a plain one; or $ALLOCTRACE_MAX_DECOMPRESSED)")
    p.epilog = EXAMPLES
    p.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run(args) -> int:
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if token == "auto":
        token = secrets.token_urlsafe(24)
    from alloctrace.server.app import check_read_tokens, check_token
    check_token(token)
    read_tokens = check_read_tokens(token, args.read_tokens or [
        t.strip() for t in os.environ.get(READ_TOKENS_ENV, "").split(",") if t.strip()])
    if not 1 <= args.workers <= MAX_WORKERS:
        raise UserError(f"--workers must be 1 to {MAX_WORKERS}")
    from alloctrace.traces.store.store import store_url
    if args.workers > 1 and store_url(args.store) is None:
        raise UserError("--workers > 1 needs a PostgreSQL store (--store postgresql://user@host:port/db): "
                        "an SQLite store is served by one process")
    if not is_loopback(args.host) and not token:
        raise UserError(f"binding {args.host} exposes the store: give --token (or set {TOKEN_ENV})")
    if not 0 < args.port < 65536:
        raise UserError(f"bad port {args.port}")
    if args.max_upload_mb <= 0:
        raise UserError("--max-upload-mb must be positive")
    from alloctrace.traces.sources.bounded_io import Limits, parse_amount
    max_decompressed = None if args.max_decompressed is None else int(parse_amount(args.max_decompressed,
                                                                                     "--max-bytes"))
    limits = Limits.from_env(max_decompressed=max_decompressed)
    sock = bind(args.host, args.port)
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from alloctrace.server.app import create_app
    from alloctrace.server.guard import allowed_hosts, slow_client_protocol
    from alloctrace.traces.store.store import open_store
    store = open_store(args.store)
    if args.examples:
        from alloctrace.server.examples import seed_examples
        seeded = seed_examples(store)
        if seeded:
            print(f"examples: stored {len(seeded)} trace(s): {' '.join(seeded)}")
    hosts = allowed_hosts(args.host)
    if args.workers == 1:
        app = create_app(token=token, max_upload_bytes=args.max_upload_mb * 1024 * 1024, store=store,
                         hosts=hosts, limits=limits, read_tokens=read_tokens)
    else:
        store.close()  # each worker opens its own
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else host}:{args.port}/"
    shown = url
    if token:
        url += f"?token={token}"
        where = save_url(url, args.port)
        shown += f" (the address with its token is in {where}, readable by you only)"
    print(f"alloctrace: serving on {shown}", flush=True)
    if args.open:
        if has_display():
            threading.Timer(1.0, open_browser, (url, shown)).start()
        else:
            print(f"alloctrace: no display to open a browser on; open {shown} in a browser", flush=True)
    files = _raise_file_limit()
    limit_concurrency = max(8, files - 32)  # connections beyond what the file table holds get a 503, never a 500
    from alloctrace.server.workers import one_line_logging, run_workers
    one_line_logging()
    if args.verbose:  # each request's store, budgets, reader and stage times, as `-v` prints for a command
        logging.getLogger("alloctrace.server").setLevel(logging.DEBUG)
    if args.workers > 1:
        settings = {"store": store_url(args.store), "token": token, "read_tokens": list(read_tokens),
                    "max_upload_bytes": args.max_upload_mb * 1024 * 1024, "max_decompressed": max_decompressed,
                    "hosts": None if hosts is None else sorted(hosts)}
        try:
            run_workers(settings, sock, args.workers, max(8, limit_concurrency // args.workers))
        finally:
            sock.close()
        return 0
    # no access log: at this log level it would print nothing, yet build each request's line first
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30,
                                           http=slow_client_protocol(AutoHTTPProtocol),
                                           limit_concurrency=limit_concurrency))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def save_url(url: str, port: int) -> Path:
    """Write the address with its token to a file only this user can read, and return its path: a token
    printed on the terminal ends up in scrollback, screen shares and CI logs."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.environ.get("XDG_STATE_HOME") \
        or os.path.join(os.path.expanduser("~"), ".local", "state")
    folder = Path(base) / "alloctrace"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if folder.is_symlink() or folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
            raise UserError(f"{folder}: not a private folder of this user's; the token is not written there")
        path = folder / f"serve-{port}.url"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)
            f.write(url + "\n")
    except OSError as e:
        raise UserError(f"cannot write the server's address to {folder}: {e.strerror or e}") from None
    return path


def has_display() -> bool:
    """Linux and BSD need an X or Wayland display for a browser window; macOS and Windows always have one."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_browser(url: str, shown: str):
    if not webbrowser.open(url):
        print(f"alloctrace: found no browser to start; open {shown} in a browser", flush=True)


def _raise_file_limit() -> int:
    """Open files allowed now: the soft limit raised to the hard one (many slow clients)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 65536


def bind(host: str, port: int) -> socket.socket:
    """Bind before anything else starts, so a busy port is one clear error line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except (socket.gaierror, UnicodeError) as e:
        sock.close()
        raise UserError(f"bad host {host!r}: {e}") from None
    except OSError as e:
        sock.close()
        raise UserError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock
