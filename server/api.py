"""The JSON API under /api: traces, their graphs' events, memory maps and states, diff, replay.

Every answer is JSON; names from traces are data inside it, never markup. Trace
ids and diff refs are checked against patterns before they reach the store.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Annotated


from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from starlette.requests import ClientDisconnect

from alloctrace.traces.errors import UserError
from alloctrace.traces.export import formats as export_formats
from alloctrace.server import graphs, upload
from alloctrace.traces import memmap
from alloctrace.traces.util.lru import LRU
from alloctrace.traces.store.graph_info import events_page, with_ggml_lines, with_uncertainty
from alloctrace.traces.memmap.live_ops import name_live_ops, name_live_ops_from_lifetimes
from alloctrace.traces.state.index import state_json
from alloctrace.server.context import Context
from alloctrace.server.threads import in_import_thread
from alloctrace.server.mapjson import memory_map_json
from alloctrace.traces.util.textsafe import safe
from alloctrace.traces.sources.bounded_io import Cancelled
from alloctrace.traces.store.records import TraceList, TraceSummary
from alloctrace.traces.store.store import NotFound
from alloctrace.server.graphs import BudgetJSONResponse as JSONResponse

TRACE_ID = r"^[0-9a-f]{8}$"
REF = r"^[0-9a-f]{8}(:[0-9]{1,6})?$"
MAX_GRAPH = 1_000_000
DISCONNECT_POLL_S = 0.25
log = logging.getLogger("alloctrace.server")

router = APIRouter(prefix="/api")
TraceId = Annotated[str, Path(pattern=TRACE_ID, description="8 hex digits")]
GraphIndex = Annotated[int, Path(ge=0, le=MAX_GRAPH, description="graph index within the trace")]
UPLOAD_SCHEMA = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file"],
    "properties": {"file": {"type": "string", "format": "binary",
                            "description": "a ggml log with AT_PRINTF lines (plain, gzip or zstd)"},
                   "name": {"type": "string", "maxLength": upload.FIELD_LIMIT,
                            "description": "trace name (default: the file's name)"},
                   "tag": {"type": "array", "items": {"type": "string"}, "maxItems": upload.MAX_TAG_FIELDS,
                           "description": "key=value tags (repeat the field)"}}}}}}}


ACCESS = "alloctrace.access"  # scope extension the token guard (app.py) sets on /api requests: "read" or "write"


def ctx(request: Request) -> Context:
    c = request.app.state.ctx
    c.fresh()  # another server on this store may have deleted a trace we hold answers for
    return c


def uncached(request: Request) -> Context:
    """The Context for an answer read from the store itself, none of the per-graph caches: no generation read
    first (a round trip to the database, every request of a list or a summary did it for nothing)."""
    return request.app.state.ctx


# the answers follow traces/store/records.py (the schema JSON Lines imports are checked against); they are
# documented with it but not re-validated, so a store written by an older version still lists
@router.get("/traces", summary="List stored traces", responses={200: {"model": TraceList}})
def list_traces(request: Request, q: Annotated[str | None, Query(max_length=200, description="name search")] = None,
                tag: Annotated[list[str], Query(max_length=300, description="key=value; repeat: all must match")] = [],
                ):
    if len(tag) > 64:
        raise UserError("at most 64 tags")
    found = uncached(request).call(lambda s: with_uncertainty(s, s.list(q, tag) if q or tag else s.list()))
    return JSONResponse({"traces": [with_ggml_lines(t) for t in found]})  # plain JSON values: no encoder pass


@router.post("/traces", status_code=201, summary="Upload a log and import it", openapi_extra=UPLOAD_SCHEMA)
async def upload_trace(request: Request):
    c = ctx(request)
    try:
        up = await upload.receive_upload(request, c.upload_dir, c.max_upload_bytes)
    except ClientDisconnect:
        log.warning("upload: the client disconnected while sending; nothing stored")
        return Response(status_code=499)
    try:
        if up.path is None:
            raise upload.UploadError("the form has no `file` field")
        label = display_name(up.filename)
        name = (up.fields.get("name") or "").strip() or label
        from alloctrace.traces.store.tags import parse_tags
        tags = parse_tags(up.fields.get("tag") or [])
        gone = threading.Event()
        work = asyncio.ensure_future(in_import_thread(request, c.import_file, up.path, name, label, gone.is_set, tags))
        while not work.done():  # the parse stops when the client goes away
            await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
            if not work.done() and await request.is_disconnected():
                gone.set()
        try:
            summaries = await work
        except Cancelled:
            log.warning("upload %s: the client disconnected; import cancelled, nothing stored",
                        safe(label or "upload"))
            return Response(status_code=499)
    finally:
        up.cleanup()
    summaries = await run_in_threadpool(c.call, lambda s: with_uncertainty(s, summaries))
    return JSONResponse({"traces": [with_ggml_lines(t) for t in summaries]}, status_code=201)


def display_name(filename: str | None) -> str | None:
    """The client's file name, shortened to its last component: a label, never a path."""
    if not filename:
        return None
    base = filename.replace("\\", "/").rsplit("/", 1)[-1].strip()
    return base[:200] or None


@router.get("/traces/{trace_id}", summary="One trace's summary", responses={200: {"model": TraceSummary}})
def get_trace(request: Request, trace_id: TraceId):
    found = uncached(request).call(lambda s: with_uncertainty(s, [s.summary(trace_id)])[0])
    return JSONResponse(with_ggml_lines(found))


@router.delete("/traces/{trace_id}", summary="Delete a trace")
def delete_trace(request: Request, trace_id: TraceId):
    c = ctx(request)
    c.write(lambda s: s.delete(trace_id))
    c.forget(trace_id)
    return {"deleted": trace_id}


@router.get("/traces/{trace_id}/graphs/{g}/events", summary="A page of a graph's events")
def get_events(request: Request, trace_id: TraceId, g: GraphIndex,
               start: Annotated[int, Query(ge=0)] = 0,
               limit: Annotated[int, Query(ge=1, le=graphs.MAX_PAGE)] = 200,
               kind: Annotated[str | None, Query(max_length=40, description="event kind, e.g. alloc")] = None,
               tensor: Annotated[str | None, Query(max_length=200, description="exact tensor name")] = None):
    c = ctx(request)
    return JSONResponse(events_page(c.columns(trace_id, g), start, limit, kind, tensor))


@router.get("/traces/{trace_id}/graphs/{g}/memory-map", summary="Tensor lifetimes in a view window")
def get_memory_map(request: Request, trace_id: TraceId, g: GraphIndex,
                   x0: Annotated[int | None, Query(ge=0, description="first event of the window")] = None,
                   x1: Annotated[int | None, Query(ge=1, description="end event (exclusive)")] = None,
                   y0: Annotated[int | None, Query(ge=0, description="lowest address (bytes)")] = None,
                   y1: Annotated[int | None, Query(ge=1, description="highest address (exclusive)")] = None,
                   max_shapes: Annotated[int, Query(ge=1, le=graphs.MAX_SHAPES)] = 2000,
                   max_points: Annotated[int, Query(ge=1, le=graphs.MAX_POINTS)] = 1000):
    c = ctx(request)
    info = c.graph_info(trace_id, g, lazy=True)  # a graph with stored lifetimes is never decoded whole
    lt = c.lifetimes(trace_id, g)
    win = memmap.window(lt, info, x0, x1, y0, y1)
    # traces never change once stored, so a view asked for again (a dashboard opening) is rendered once
    body = c.map_cache.get((trace_id, g, win, max_shapes, max_points),
                           lambda: memory_map_json(lt, info, win, max_shapes, max_points))
    return Response(body, media_type="application/json")


@router.get("/traces/{trace_id}/graphs/{g}/state", summary="Allocator state after the first N events")
def get_state(request: Request, trace_id: TraceId, g: GraphIndex,
              event: Annotated[int, Query(ge=0, description="events applied (0..n_events)")]):
    c = ctx(request)
    info = c.graph_info(trace_id, g, lazy=True)
    if event > info["n_events"]:
        raise UserError(f"event {event} is out of range (0..{info['n_events']})")
    nxt = c.event_rows(trace_id, g, [event])[0] if event < info["n_events"] else None
    body = c.with_state_index(trace_id, g, lambda index: state_json(index, event, nxt))
    live = body.get("live") or []
    lt = c.lifetimes_cache.peek((trace_id, g))  # the map's, when it was drawn; else only the live bytes' events
    if lt is None and not name_live_ops(live, c.some_columns(trace_id, g), event):
        lt = c.lifetimes(trace_id, g)
    if lt is not None:
        name_live_ops_from_lifetimes(live, lt, event)
    return JSONResponse(body)


@router.get("/traces/{trace_id}/export", summary="Download a trace: JSON Lines, CSV, or Chrome trace JSON")
def get_export(request: Request, trace_id: TraceId,
               format: Annotated[str, Query(pattern=export_formats.query_pattern(),
                                            description="; ".join(f"{f.name}: {f.what}" for f in
                                                                  export_formats.FORMATS.values()))] = "chrome"):
    """Streamed one graph at a time from the first graph on (a long trace's download starts at once and never
    sits in memory whole); an unknown trace is a 404 before the first byte."""
    from alloctrace.traces.export.ggml import export_chunks

    pieces = ctx(request).call(lambda s: export_chunks(s, trace_id, format))

    def chunks():
        for piece in pieces:
            yield piece.encode("utf-8")

    media, suffix = export_formats.FORMATS[format].media_type, export_formats.FORMATS[format].suffix
    return StreamingResponse(chunks(), media_type=media, headers={
        "Content-Disposition": f'attachment; filename="trace-{trace_id}.{suffix}"'})


_OVERVIEWS = LRU(16)


@router.get("/traces/{trace_id}/overview", summary="Every graph's own high water, buffer, max_size and failure")
def get_overview(request: Request, trace_id: TraceId):
    """For the run chart of a long trace (one point per graph); built once per trace and kept."""
    from alloctrace.traces.explain.run_overview import run_overview

    c = ctx(request)
    created = c.call(lambda s: s.meta(trace_id).created)  # a deleted trace is a 404 here, not a kept answer
    return _OVERVIEWS.get((trace_id, created), lambda: c.call(lambda s: run_overview(s, trace_id)))


@router.get("/traces/{trace_id}/graphs/{g}/consistency",
            summary="Whether the model reproduced this graph, and the placements it got wrong")
def get_consistency(request: Request, trace_id: TraceId, g: GraphIndex):
    from alloctrace.traces.store.graph_info import consistency
    return JSONResponse(ctx(request).call(lambda s: consistency(s, trace_id, g)))


@router.get("/traces/{trace_id}/graphs/{g}/peak", summary="What is live at a graph's high-water mark, by family")
def get_peak(request: Request, trace_id: TraceId, g: GraphIndex):
    from alloctrace.traces.explain.peak import peak_json
    return JSONResponse(ctx(request).call(lambda s: peak_json(s, f"{trace_id}:{g}")))


@router.get("/sweep", summary="Replay a preset once per (profile, n_ctx, n_batch): buffer size per point")
def get_sweep(preset: Annotated[str, Query(max_length=100)],
              profile: Annotated[str, Query(max_length=400, description="comma-separated profiles")],
              n_ctx: Annotated[str | None, Query(max_length=400, description="comma-separated")] = None,
              n_batch: Annotated[str | None, Query(max_length=400, description="comma-separated")] = None,
              metal_concurrency: bool = False):
    from alloctrace.traces.replay.sweep import parse_values, sweep
    profiles = [p.strip() for p in profile.split(",") if p.strip()]
    return sweep(preset, profiles, parse_values(n_ctx, "n_ctx"), parse_values(n_batch, "n_batch"),
                 metal_concurrency, max_points=64)


@router.get("/sweeps", summary="Recorded sweeps (`alloctrace sweep --vary`): id, points, name, newest first")
def get_sweeps(request: Request):
    from alloctrace.traces.preflight.sweeps import sweep_ids
    return {"sweeps": ctx(request).call(sweep_ids)}


@router.get("/sweeps/{sweep_id}", summary="A recorded sweep: its points, growth laws, dominance, neighbours")
def get_recorded_sweep(request: Request, sweep_id: Annotated[str, Path(pattern=r"^[0-9a-f]{1,32}$")]):
    from alloctrace.traces.preflight.sweeps import load
    return JSONResponse(ctx(request).call(lambda s: load(s, sweep_id)))


@router.get("/preflight", summary="Stored pre-flight results (sweeps, fits, `plan --vary` searches), newest first")
def get_preflights(request: Request):
    from alloctrace.traces.preflight.curves import listed
    return {"results": ctx(request).call(listed)}


@router.get("/preflight/{pid}", summary="A pre-flight result as curves against its knob: every buffer, KV cache or "
                                        "category, the total, laws, predicted points, the budget and the answer")
def get_preflight(request: Request, pid: Annotated[str, Path(pattern=r"^[0-9a-f]{1,32}$")],
                  budget: Annotated[str | None, Query(max_length=40, description="another budget: 8GiB, "
                                                      "512MiB or bytes")] = None):
    from alloctrace.traces.preflight.budget import parse_budget
    from alloctrace.traces.preflight.curves import load
    given = parse_budget(budget) if budget else None
    return JSONResponse(ctx(request).call(lambda s: load(s, pid, given)))


@router.get("/diff", summary="Diff two graphs (ID:G) or two whole traces (ID)")
def get_diff(request: Request, a: Annotated[str, Query(pattern=REF)], b: Annotated[str, Query(pattern=REF)]):
    from alloctrace.traces.diff.graphs import diff_refs
    from alloctrace.traces.diff.torch_snapshots import diff_stored
    from alloctrace.traces.store.kinds import TORCH, require_same_kind

    def answer(s):  # two PyTorch snapshots: the aligned call-site diff; a mixed pair: one refusal
        return diff_stored(s, a, b) if require_same_kind(s, a, b) == TORCH else diff_refs(s, a, b).to_json()
    return JSONResponse(ctx(request).call(answer))


class ReplayRequest(BaseModel):
    preset: str = Field(max_length=100)
    profile: str = Field(max_length=100)
    n_ctx: int | None = Field(None, ge=1, le=1 << 20, description="default: the preset's")
    n_batch: int | None = Field(None, ge=1, le=1 << 20, description="default: the program's")
    eval_tokens: int | None = Field(None, ge=0, le=1 << 20)
    n_past: int | None = Field(None, ge=0, le=1 << 20)
    metal_concurrency: bool = False


@router.post("/replay", status_code=201, summary="Replay a model preset and store its traces",
             description="An identical replay stored before (same name, description and graphs) is kept instead "
                         "of a second copy: `reused` is true and the ids point at it.")
def post_replay(request: Request, body: Annotated[ReplayRequest, Body()]):
    from alloctrace.traces.replay.reuse import keep_one_copy, stored_ids

    c = ctx(request)
    result = c.replay(body.model_dump())
    stored = stored_ids(result)
    result, reused = c.write(lambda s: keep_one_copy(s, result))
    if reused:
        c.forget(stored[0])
    ids = stored_ids(result)
    return JSONResponse({"traces": [c.call(lambda s, i=i: s.summary(i)) for i in ids], "replay": result,
                         "reused": reused}, status_code=201 if not reused else 200)


@router.get("/access", summary="Whether this caller may change the store (upload, delete, replay)")
def get_access(request: Request):
    """The dashboard shows upload and delete controls only when `can_write`: false for a read-only token, and
    for a store whose database role may only read."""
    token_level = request.scope.get("extensions", {}).get(ACCESS, "write")
    read_only_store = bool(getattr(uncached(request).store, "read_only", False))
    return {"can_write": token_level == "write" and not read_only_store,
            "why": "read-only token" if token_level != "write" else "read-only store" if read_only_store else None}


@router.get("/presets", summary="Model presets and allocator profiles for replay")
def get_presets():
    from alloctrace.traces.replay.catalog import catalog_json
    return catalog_json()
