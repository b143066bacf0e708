"""HTTP for PyTorch snapshots: upload, summary, timeline, state, peak, OOM card, entries, diff.
(The /torch page is served with the other pages by server/app.py.)

Views are built from a per-device cache (columns and derived arrays, a state
index with checkpoints), so a dashboard asking again and again costs little;
every answer is bounded by its query's limits, whatever the snapshot's size.
"""
from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam

from alloctrace.traces.errors import UserError
from alloctrace.server import upload
from alloctrace.server.threads import in_import_thread
from alloctrace.traces.store.kinds import TORCH, kind_of_source, require_kind, trace_kind
from alloctrace.traces.util.lru import LRU
from alloctrace.server.graphs import BudgetJSONResponse as JSONResponse

TRACE_ID = r"^[0-9a-f]{8}$"
REF = r"^[0-9a-f]{8}(:[0-9]{1,4})?$"
TraceId = Annotated[str, PathParam(pattern=TRACE_ID, description="8 hex digits")]
Device = Annotated[int, PathParam(ge=0, le=4096, description="device index")]
Skip = Annotated[str | None, Query(max_length=2000, description="comma-separated file-name parts of frames to skip "
                                                                "(default: torch's own files; 'default,PART' adds to them)")]

router = APIRouter()


class _Views:
    """Per (trace, device): the loaded Device and its StateIndex (one lock: the index has a cursor)."""

    def __init__(self):
        self.devices = LRU(8)
        self.states = LRU(8)
        self.locks: dict = {}
        self.lock = threading.Lock()

    def device(self, store, tid: str, d: int):
        from alloctrace.traces.state.torch_device import load_device
        return self.devices.get((tid, d), lambda: load_device(store, tid, d))

    def state_index(self, store, tid: str, d: int):
        from alloctrace.traces.state.torch_device import StateIndex
        idx = self.states.get((tid, d), lambda: StateIndex(self.device(store, tid, d)))
        with self.lock:
            lock = self.locks.setdefault((tid, d), threading.Lock())
        return idx, lock


def _views(request: Request) -> _Views:
    st = request.app.state
    if getattr(st, "torch_views", None) is None:
        st.torch_views = _Views()
    return st.torch_views


def _store(request: Request):
    return request.app.state.ctx.store


def is_torch_trace(store, tid: str) -> bool:
    """Is this stored trace a PyTorch snapshot (False for unknown ids: their page says so itself)?"""
    try:
        return trace_kind(store, tid) == TORCH
    except UserError:
        return False


def _check_id(tid: str) -> str:
    import re
    if not re.fullmatch(TRACE_ID.strip("^$"), tid):
        raise UserError(f"not a trace id: {tid[:20]!r}")
    return tid


def _skip(skip: str | None):
    from alloctrace.traces.state.torch_frames import parse_skip
    return parse_skip(skip)


def _device(request: Request, tid: str, d: int):
    _check_id(tid)
    store = _store(request)
    require_kind(store, tid, TORCH)
    if d not in [g["index"] for g in store.summary(tid)["graphs"]]:
        from alloctrace.traces.store.store import NotFound
        raise NotFound(f"trace {tid} has no device {d}")
    return _views(request).device(store, tid, d)


@router.post("/api/torch/traces", status_code=201, summary="Upload a PyTorch memory snapshot (.pickle[.gz|.zst])")
async def upload_snapshot(request: Request):
    from alloctrace.traces.store.torch_stored import torch_summary
    c = request.app.state.ctx
    up = await upload.receive_upload(request, c.upload_dir, c.max_upload_bytes)
    try:
        if up.path is None:
            raise upload.UploadError("the form has no `file` field")
        label = _label(up.filename) or "snapshot"
        name = (up.fields.get("name") or "").strip()[:200] or label

        done = await in_import_thread(request, c.import_file, up.path, name, label)
        if any(kind_of_source(s["source"]) != TORCH for s in done):
            for s in done:
                c.write(lambda st, tid=s["id"]: st.delete(tid))
            raise UserError(f"{label}: not a PyTorch memory snapshot")
        tid = done[0]["id"]
    finally:
        up.cleanup()
    return JSONResponse({"traces": [torch_summary(c.store, tid)]}, status_code=201)


def _label(filename: str | None) -> str | None:
    if not filename:
        return None
    return filename.replace("\\", "/").rsplit("/", 1)[-1].strip()[:200] or None


@router.get("/api/torch/traces/{trace_id}", summary="A torch trace: devices, peaks, OOM, settings")
def get_summary(request: Request, trace_id: TraceId):
    from alloctrace.traces.state.torch_device import device_summary
    from alloctrace.traces.store.torch_stored import torch_summary
    store = _store(request)
    _check_id(trace_id)
    require_kind(store, trace_id, TORCH)
    from alloctrace.traces.store.torch_stored import categories
    out = torch_summary(store, trace_id)
    out["categories"] = categories(store, trace_id)
    for d in out["devices"]:
        d.update(device_summary(_views(request).device(store, trace_id, d["device"])))
    return out


@router.get("/api/torch/traces/{trace_id}/devices/{d}/timeline", summary="Active memory over entries (bounded)")
def get_timeline(request: Request, trace_id: TraceId, d: Device,
                 x0: Annotated[int | None, Query(ge=0)] = None, x1: Annotated[int | None, Query(ge=1)] = None,
                 max_points: Annotated[int, Query(ge=10, le=5000)] = 1000,
                 max_bands: Annotated[int, Query(ge=0, le=500)] = 120,
                 band_points: Annotated[int, Query(ge=2, le=2000)] = 300, skip: Skip = None,
                 frames: Annotated[int, Query(ge=0, le=16, description="frames of each band's stack, for hover")] = 0):
    from alloctrace.traces.memmap.torch_timeline import timeline
    dev = _device(request, trace_id, d)
    if x0 is not None and x1 is not None and x1 <= x0:
        raise UserError(f"empty entry range: x1 ({x1}) must be above x0 ({x0})")
    return JSONResponse(timeline(dev, x0, x1, max_points, max_bands, band_points, _skip(skip), frames))


@router.get("/api/torch/traces/{trace_id}/devices/{d}/state", summary="Segments and blocks after N entries")
def get_state(request: Request, trace_id: TraceId, d: Device,
              event: Annotated[int, Query(ge=0, description="entries applied (0..n): the state after entry event-1, "
                                                               "its `after_entry` in the answer")],
              max_blocks: Annotated[int, Query(ge=1, le=100_000)] = 20_000, skip: Skip = None):
    from alloctrace.traces.state.torch_device import state
    dev = _device(request, trace_id, d)
    if event > dev.n:
        raise UserError(f"event {event} is out of range (0..{dev.n})")
    idx, lock = _views(request).state_index(_store(request), trace_id, d)
    with lock:
        return JSONResponse(state(dev, idx, event, _skip(skip), max_blocks))


@router.get("/api/torch/traces/{trace_id}/devices/{d}/peak", summary="Live allocations at the peak, by call site")
def get_peak(request: Request, trace_id: TraceId, d: Device, skip: Skip = None,
             top: Annotated[int, Query(ge=1, le=1000)] = 50):
    from alloctrace.traces.explain.torch_peak import peak
    return JSONResponse(peak(_device(request, trace_id, d), _skip(skip), top))


@router.get("/api/torch/traces/{trace_id}/devices/{d}/live", summary="The largest allocations live after an entry")
def get_live(request: Request, trace_id: TraceId, d: Device,
             at: Annotated[int, Query(ge=0, description="after entry `at` (entries 0..at applied)")],
             skip: Skip = None, top: Annotated[int, Query(ge=1, le=200)] = 10):
    from alloctrace.traces.explain.torch_peak import largest_live
    dev = _device(request, trace_id, d)
    if at >= max(dev.n, 1):
        raise UserError(f"entry {at} is out of range (0..{max(dev.n - 1, 0)})")
    return JSONResponse({"after_entry": at, "largest": largest_live(dev, at, _skip(skip), top)})


@router.get("/api/torch/traces/{trace_id}/devices/{d}/oom", summary="The OOM card (null when none)")
def get_oom(request: Request, trace_id: TraceId, d: Device, skip: Skip = None,
            which: Annotated[int, Query(ge=0, le=1_000_000)] = 0):
    from alloctrace.traces.explain.torch_peak import oom_card
    dev = _device(request, trace_id, d)
    idx, lock = _views(request).state_index(_store(request), trace_id, d)
    with lock:
        return JSONResponse({"oom": oom_card(dev, idx, _skip(skip), which)})


@router.get("/api/torch/traces/{trace_id}/devices/{d}/entries", summary="A page of trace entries")
def get_entries(request: Request, trace_id: TraceId, d: Device, start: Annotated[int, Query(ge=0)] = 0,
                limit: Annotated[int, Query(ge=1, le=2000)] = 100, skip: Skip = None,
                frames: Annotated[bool, Query(description="include each entry's stack")] = False):
    from alloctrace.traces.state.torch_device import entry
    dev = _device(request, trace_id, d)
    sk = _skip(skip)
    rows = [entry(dev, k, sk, frames) for k in range(min(start, dev.n), min(start + limit, dev.n))]
    if frames:  # where each entry's stack sits in the flamegraph (its kept frames, outermost first)
        from alloctrace.traces.explain.torch_flame import stack_path
        for r in rows:
            r["flame_path"] = stack_path(dev, int(dev.cols["stack"][r["i"]]), r["i"], sk)
    return {"total": dev.n, "start": start, "entries": rows}


@router.get("/api/torch/diff", summary="Diff two snapshots (ID or ID:DEVICE)")
def get_diff(request: Request, a: Annotated[str, Query(pattern=REF)], b: Annotated[str, Query(pattern=REF)],
             skip: Skip = None, top: Annotated[int, Query(ge=1, le=500)] = 40):
    from alloctrace.traces.diff.torch_snapshots import diff
    da, db = (_device(request, *_ref(r)) for r in (a, b))
    return JSONResponse(diff(da, db, _skip(skip), top))


def _ref(ref: str) -> tuple[str, int]:
    tid, _, d = ref.partition(":")
    return tid, int(d or 0)


@router.get("/api/torch/traces/{trace_id}/devices/{d}/flame", summary="Memory flamegraph at an entry (SVG inside)")
def get_flame(request: Request, trace_id: TraceId, d: Device,
              at: Annotated[str, Query(pattern=r"^(peak|oom|end|[0-9]{1,12})$",
                                       description="entry number, peak, oom or end")] = "peak",
              min_share: Annotated[float, Query(ge=0, lt=1)] = 0.002, skip: Skip = None,
              tree: Annotated[bool, Query(description="include the tree itself")] = False):
    from alloctrace.traces.explain import torch_flame_svg as flame_svg
    from alloctrace.traces.explain.torch_flame import flame
    dev = _device(request, trace_id, d)
    f = flame(dev, at, _skip(skip), max(min_share, 0.0005))  # the floor bounds the answer
    f["svg"] = flame_svg.svg(f)
    if not tree:
        f.pop("tree")
    return JSONResponse(f)


@router.get("/api/torch/traces/{trace_id}/ranks", summary="The ranks (devices) of a trace side by side")
def get_ranks(request: Request, trace_id: TraceId, skip: Skip = None,
              max_points: Annotated[int, Query(ge=10, le=2000)] = 400):
    from alloctrace.traces.diff.torch_ranks import compare
    from alloctrace.traces.memmap.torch_timeline import timeline
    _check_id(trace_id)
    store = _store(request)
    out = compare(store, trace_id, _skip(skip))
    for r in out["ranks"]:  # each rank's curves over time, sampled as the timeline samples them
        t = timeline(_views(request).device(store, trace_id, r["device"]), max_points=max_points, max_bands=0)
        r["series"] = {k: t.get(k, []) for k in ("grid", "time_us", "allocated_max", "reserved_max")}
    return JSONResponse(out)
