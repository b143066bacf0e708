"""Several server processes over one shared store (`alloctrace serve --workers N`, PostgreSQL only).

uvicorn starts N processes that accept on the socket `serve` bound; each builds its own app from
the settings the parent put in the environment (a spawned process inherits no objects). Their
caches stay correct because each request first reads the store's generation, which lives in the
database: a delete or an upload on one worker is seen by the next request on any other.
"""
from __future__ import annotations

import json
import logging
import os

from uvicorn.protocols.http.auto import AutoHTTPProtocol

from alloctrace.server.guard import slow_client_protocol

SETTINGS_ENV = "ALLOCTRACE_SERVE_SETTINGS"
SlowClientHTTP = slow_client_protocol(AutoHTTPProtocol)  # importable by name in each worker


def one_line_logging():
    """Refusals, disconnects, exhausted resources: one line each on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("alloctrace: %(levelname)s: %(message)s"))
    server_log = logging.getLogger("alloctrace.server")
    server_log.addHandler(handler)
    server_log.setLevel(logging.WARNING)
    server_log.propagate = False


def app_from_env():
    """The app of one worker, from the parent's settings (uvicorn's factory)."""
    from alloctrace.server.app import create_app
    from alloctrace.traces.sources.bounded_io import Limits
    from alloctrace.traces.store.store import open_store

    s = json.loads(os.environ[SETTINGS_ENV])
    one_line_logging()
    limits = Limits.from_env(max_decompressed=s["max_decompressed"])
    return create_app(store=open_store(s["store"]), token=s["token"], read_tokens=s["read_tokens"],
                      max_upload_bytes=s["max_upload_bytes"], hosts=None if s["hosts"] is None else set(s["hosts"]),
                      limits=limits)


def run_workers(settings: dict, sock, workers: int, limit_concurrency: int):
    """Serve on `sock` with `workers` processes until interrupted."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ[SETTINGS_ENV] = json.dumps(settings)
    config = uvicorn.Config("alloctrace.server.workers:app_from_env", factory=True, workers=workers,
                            http="alloctrace.server.workers:SlowClientHTTP", log_level="warning", access_log=False,
                            timeout_keep_alive=30, limit_concurrency=limit_concurrency)
    Multiprocess(config, sockets=[sock]).run()
