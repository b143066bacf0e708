"""A plain ASGI answer for memory-map views of graphs that are loaded already.

A memory-map answer is a join of pre-formatted rows (mapjson.py), a millisecond or
less; FastAPI's routing, parameter validation and threadpool hand-off cost about as
much again. `MemoryMapFastPath` sits inside the guards (Host/Origin and token checks
still run first) and answers `GET .../graphs/{g}/memory-map` itself only when

- the path and every known query parameter are plain decimal numbers within the
  route's bounds (each at most once), and
- the graph's info and lifetimes (with its pyramid and rows) are cached and the
  store's generation is read without waiting: a cold graph is built by the FastAPI
  route, in a worker thread, and a store busy with a long read is waited for there.

Everything else (a bad or repeated parameter, a window that is empty, a graph not
loaded, any error) goes on to the FastAPI route unchanged, so validation errors,
404s and 400s stay exactly its answers. The answer itself is the same cached
bytes the route returns (context.map_cache) with the same headers;
tests/server/test_server_mapjson_fast.py compares both paths.
"""
from __future__ import annotations

import re
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool

from alloctrace.server import graphs
from alloctrace.server.api import MAX_GRAPH
from alloctrace.server.mapjson import memory_map_json
from alloctrace.traces import memmap

MAP_PATH = re.compile(r"/api/traces/(?P<trace>[0-9a-f]{8})/graphs/(?P<g>0|[1-9][0-9]{0,6})/memory-map")
DIGITS = re.compile(r"0|[1-9][0-9]{0,17}")  # what any int parser reads the same way (no sign, spaces, _)
# name -> (lowest, highest, default); the route's Query bounds (api.get_memory_map)
PARAMS = {"x0": (0, None, None), "x1": (1, None, None), "y0": (0, None, None), "y1": (1, None, None),
          "max_shapes": (1, graphs.MAX_SHAPES, 2000), "max_points": (1, graphs.MAX_POINTS, 1000)}
INLINE_BUDGET = 4000  # answers with at most this many shapes and points are joined on the event loop;
# bigger budgets (more rows to format) go to a worker thread so the loop is never held long


def query_params(query: bytes) -> dict | None:
    """The map's parameters as ints (defaults filled in), or None when any is not plainly valid."""
    got = {}
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        bounds = PARAMS.get(key)
        if bounds is None:
            continue  # the route ignores parameters it does not know
        if key in got or not DIGITS.fullmatch(value):
            return None
        v = int(value)
        if v < bounds[0] or (bounds[1] is not None and v > bounds[1]):
            return None
        got[key] = v
    return {k: got.get(k, default) for k, (_, _, default) in PARAMS.items()}


class MemoryMapFastPath:
    """ASGI middleware: warm memory-map views answered without the framework (see the module doc)."""

    def __init__(self, app, ctx):
        self.app, self.ctx = app, ctx

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET":
            m = MAP_PATH.fullmatch(scope["path"])
            if m is not None:
                body = await self.answer(m["trace"], int(m["g"]), scope.get("query_string", b""))
                if body is not None:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-length", str(len(body)).encode()),
                                            (b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)

    async def answer(self, trace_id: str, g: int, query: bytes) -> bytes | None:
        p = query_params(query)
        if p is None or g > MAX_GRAPH:
            return None
        c = self.ctx
        try:
            if not c.fresh_now():  # as the route checks: a trace deleted by another process is not
                return None  # answered from cache; a busy or changed store is the route's to wait for
            info, lt = c.info_cache.peek((trace_id, g)), c.lifetimes_cache.peek((trace_id, g))
            if info is None or lt is None:
                return None
            win = memmap.window(lt, info, p["x0"], p["x1"], p["y0"], p["y1"])
            key = (trace_id, g, win, p["max_shapes"], p["max_points"])
            body = c.map_cache.peek(key)
            if body is not None:
                return body

            def build():
                return c.map_cache.get(key, lambda: memory_map_json(lt, info, win, p["max_shapes"], p["max_points"]))
            if max(p["max_shapes"], p["max_points"]) <= INLINE_BUDGET:
                return build()
            return await run_in_threadpool(build)
        except Exception:  # noqa: BLE001 - the route answers it again, with its own error handling
            return None
