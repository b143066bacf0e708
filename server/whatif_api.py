"""HTTP for the caching-allocator what-if: one device of a stored PyTorch snapshot under other settings.

`GET /api/torch/traces/{id}/devices/{d}/whatif?set=expandable_segments=true&cap=6GiB&points=600` answers what
`alloctrace whatif --json` prints, plus both runs' reserved/allocated curves in at most `points` buckets (so the
payload does not grow with the snapshot). Answers are cached per (trace, device, settings).
"""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from alloctrace.server.torch_api import Device, TraceId
from alloctrace.traces.errors import UserError
from alloctrace.traces.util.lru import LRU

router = APIRouter()
CACHE_SIZE = 16


def _answers(request: Request) -> LRU:
    """The CACHE_SIZE most recently used answers of one app (a what-if of a 1M-entry trace takes seconds)."""
    st = request.app.state
    if getattr(st, "whatif_answers", None) is None:
        st.whatif_answers = LRU(CACHE_SIZE)
    return st.whatif_answers


def _load(request: Request, trace_id: str, device: int) -> tuple[dict, dict]:
    """(columns, info) of a stored torch trace's device."""
    from alloctrace.traces.store.torch_stored import device_columns, device_info

    return request.app.state.ctx.call(
        lambda store: (device_columns(store, trace_id, device), device_info(store, trace_id, device)))


@router.get("/api/torch/traces/{trace_id}/devices/{d}/whatif",
            summary="Replay the device under other caching-allocator settings (real vs what-if)")
async def get_whatif(request: Request, trace_id: TraceId, d: Device,
                     set_: Annotated[list[str], Query(alias="set", max_length=8,
                                                      description="KEY=VALUE, e.g. expandable_segments=true")] = [],
                     cap: Annotated[str | None, Query(max_length=40, description="memory cap, e.g. 6GiB")] = None,
                     recorded_cap: Annotated[str | None, Query(max_length=40)] = None,
                     points: Annotated[int, Query(ge=10, le=4000)] = 600):
    return await run_in_threadpool(_compare, request, trace_id, d, set_, cap, recorded_cap, points)


def _compare(request, trace_id, d, settings, cap, recorded_cap, points):
    if any(len(s) > 200 for s in settings):
        raise UserError("a setting is too long")
    key = (trace_id, d, tuple(sorted(settings)), cap, recorded_cap, points)
    return _answers(request).get(key, lambda: _answer(request, trace_id, d, settings, cap, recorded_cap, points))


def _answer(request, trace_id, d, settings, cap, recorded_cap, points):
    from alloctrace.traces.whatif.torch_request import downsample, whatif_request

    cols, info = _load(request, trace_id, d)
    try:
        out = whatif_request(cols, info, settings, cap, recorded_cap, keep_series=True)
    except ValueError as e:
        raise UserError(str(e)) from None
    out["series"] = downsample(out["series"], points)
    out.update(trace_id=trace_id, device=d)
    return out
