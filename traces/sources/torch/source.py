"""The "torch" trace source: a snapshot pickle -> one trace, one graph row (role "device") per device.

Each device row holds the trace entries as columns (columns.py), the stack
table, the segments and blocks at snapshot time and the annotations, all as
named numpy blobs beside one string table; `extra` holds the allocator settings
and the replayed peaks. Peaks come from the trace itself: Σalloc − Σfree_requested
(requested bytes) and Σsegment_alloc/map − Σsegment_free/unmap (reserved bytes).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from alloctrace.traces.errors import UserError
from alloctrace.traces.util.gcpause import gc_paused
from alloctrace.traces.store.columns import EncodedGraph, compressor
from alloctrace.traces.store.schema import TraceMeta
from alloctrace.traces.sources.base import ImportedTrace
from alloctrace.traces.sources.sniffers import torch_snapshot

from alloctrace.traces.sources.torch.columns import OOM, DeviceData, split_devices
from alloctrace.traces.state.torch_blocks import compare_with_snapshot, initial_state
from alloctrace.traces.store.torch_stored import curves
from alloctrace.traces.sources.torch.bounds import Budget, check_work
from alloctrace.traces.sources.torch.unpickle import DEFAULT_MAX_BYTES, SnapshotError, load_plain_sized
from alloctrace.traces.state import torch_wrapped as wrapped

NAME = "torch"
GENERATION = "torch-cuda-caching"
ROLE = "device"



def max_bytes() -> int:
    """Cap on decompressed pickle bytes ($ALLOCTRACE_TORCH_MAX_BYTES, default 2 GiB)."""
    v = os.environ.get("ALLOCTRACE_TORCH_MAX_BYTES")
    return int(v) if v and v.isdecimal() else DEFAULT_MAX_BYTES


def sniff(head: bytes) -> bool:
    """A pickle (protocol 2+) whose top-level dict starts with a snapshot's keys (sources/sniffers.py)."""
    return torch_snapshot(head)


class TorchSource:
    name = NAME

    def sniff(self, head: bytes) -> bool:
        return sniff(head)

    def read(self, stream: BinaryIO, *, filename: str, name: str | None, limits=None) -> list[ImportedTrace]:
        return [read_snapshot(stream, filename=filename, name=name, limits=limits)]


SOURCE = TorchSource()


def read_snapshot(stream: BinaryIO, *, filename: str, name: str | None = None,
                  limit: int | None = None, limits=None) -> ImportedTrace:
    """One snapshot stream (decompressed) as one trace ready for the store. The work it expands into is
    counted before it is built (bounds.check_work); `limits`' CPU and cancel caps cover the whole import."""
    label = Path(filename).name or "snapshot"
    budget = Budget(limits, label)
    with gc_paused():  # millions of plain objects, no cycles
        snap, n_bytes = load_plain_sized(stream, label=label, max_bytes=limit or max_bytes())
        budget.check()
        check_work(snap, n_bytes, label)
        try:
            devices, table = split_devices(snap, budget.check)
        except SnapshotError as e:
            raise type(e)(f"{label}: {e}") from None
        del snap
    compress = compressor()  # blobs wait for the store: each in a block of its own size
    strings = compress(json.dumps(table).encode())
    graphs, report = [], []
    for dev in devices:
        facts = device_facts(dev, table, budget.check)
        budget.check()
        graphs.append(_encoded(dev, facts, strings, compress))
        report.append(facts["report"])
    meta = TraceMeta(name=name or label, source=NAME, generation=GENERATION,
                     extra={"format": "torch-snapshot", "file": label, "devices": len(devices)})
    return ImportedTrace(meta=meta, graphs=graphs, report={"devices": report})


def baselines(cols: dict[str, np.ndarray], tables: dict[str, np.ndarray]) -> tuple[int, int]:
    """Requested and reserved bytes that existed before the first entry: the snapshot's own totals at its end
    less what the trace adds up to. (0, 0) when recording began with an empty allocator; more when the trace
    wrapped (max_entries) or began late."""
    req, res = curves(cols)
    live = int(tables["blk_requested"][tables["blk_state"] == 0].sum())
    # less than the trace's own total means the snapshot's segments disagree with it: trust the trace
    return (max(0, live - (int(req[-1]) if len(req) else 0)),
            max(0, int(tables["seg_total"].sum()) - (int(res[-1]) if len(res) else 0)))


def _peak(curve: np.ndarray) -> tuple[int, int | None]:
    if not len(curve) or curve.max() <= 0:
        return 0, None
    k = int(np.argmax(curve))
    return int(curve[k]), k


def device_facts(dev: DeviceData, strings: list[str] | None = None, tick=lambda *_: None) -> dict:
    """Peaks, the OOM and the rebuilt-state check of one device: the graph row's fields and extra.
    `tick()` is called now and then (the import's CPU cap)."""
    cols, tables = dev.cols, dev.tables
    base = baselines(cols, tables)  # (0, 0) for a trace that saw everything
    req, res = curves(cols, base)
    peak_req, at_req = _peak(req)
    peak_res, at_res = _peak(res)
    settings = dev.extra.get("allocator_settings") or {}
    partial = wrapped.analyse(cols, tables, settings)
    dev.extra["partial"] = partial   # read back by the model check below and by every view
    state = initial_state(cols, settings, partial.get("seed"))
    oom = None
    ooms = np.flatnonzero(cols["action"] == OOM)
    if len(ooms):
        k = int(ooms[0])
        t = _apply(state, k, tick).totals()
        reserved = int(res[k])  # the oom entry itself changes nothing
        oom = {"event": k, "requested": int(cols["size"][k]), "allocated": t["allocated"],
               "reserved": reserved, "cached": reserved - t["allocated"],
               "device_free": int(cols["device_free"][k]) if "device_free" in cols else None,
               "stream": int(cols["stream"][k]), "n_ooms": len(ooms)}
    _apply(state, dev.n_events, tick)
    problems = compare_with_snapshot(state, tables)
    seg_total = int(tables["seg_total"].sum())
    extra = {**dev.extra, "peak_requested": peak_req, "peak_requested_event": at_req, "peak_reserved": peak_res,
             "peak_reserved_event": at_res, "reserved_at_snapshot": seg_total,
             "baseline_requested": base[0], "baseline_reserved": base[1],
             "trace_complete": base == (0, 0) and not partial["partial"],
             "allocated_at_snapshot": int(tables["blk_size"][tables["blk_state"] <= 1].sum()),
             "n_segments": len(tables["seg_address"]), "n_blocks": len(tables["blk_address"]),
             "n_stacks": len(tables["stack_offsets"]) - 1,
             "trace_matches_snapshot": not problems and not state.mismatches,
             "state_problems": (state.mismatches[:5] + [{"problem": p} for p in problems[:5]])}
    consistency = cuda_model_check(dev, strings, tick)
    report = {"device": dev.device, "n_events": dev.n_events, "peak_requested": peak_req, "peak_reserved": peak_res,
              "oom": None if oom is None else {k: oom[k] for k in ("requested", "allocated", "reserved")}}
    report["consistent"] = consistency["consistent"]
    if partial["partial"]:
        report["partial"] = {"exact": partial.get("exact"), "exact_from": 0 if partial.get("exact") else None,
                             "reason": partial.get("reason"), "note": wrapped.note(extra)}
    if consistency["first_mismatch"] is not None:
        report["first_mismatch"] = consistency["first_mismatch"]
    extra["first_mismatch"] = consistency["first_mismatch"]
    if consistency.get("consistent"):   # the model's reading of the releases: retries vs the program's empty_cache()
        extra["alloc_retries"] = consistency.get("alloc_retries")
        extra["cache_flush_events"] = consistency.get("cache_flush_events")
    if consistency.get("model_error"):
        extra["model_error"] = report["model_error"] = consistency["model_error"]
    return {"extra": extra, "oom": oom, "consistent": consistency["consistent"],
            "report": report}


def _apply(state: AllocatorState, k: int, tick) -> AllocatorState:
    """state.apply(k), a slice at a time, with tick() between."""
    for stop in range(state.at + STEP, k, STEP):
        state.apply(stop)
        tick()
    return state.apply(k)


STEP = 1 << 16  # entries replayed between two checks of the CPU cap


def cuda_model_check(dev: DeviceData, strings: list[str] | None = None, tick=None) -> dict:
    """Replay the device through the caching-allocator model (`torch_whatif.check_device`): its `columns` are
    what `store.device_columns` returns and its `info` what `store.device_info` does (built here before the row
    is stored). A trace with OOMs is checked under the cap its OOMs imply. A model that fails is reported
    (`model_error`), never an import failure."""
    from alloctrace.traces.whatif import torch_request as torch_whatif  # lazy: sniffing loads this module too; only reading needs the model

    from alloctrace.traces.store.torch_stored import info_from
    cols = dict(dev.cols)
    cols.setdefault("device_free", np.full(dev.n_events, -1, dtype=np.int64))
    info = info_from(dev.extra, dev.tables, strings)
    info["n_events"] = dev.n_events
    try:
        out = torch_whatif.check_device(cols, info, progress=tick)
    except UserError:
        raise
    except Exception as e:  # the model's own bug: say so, keep the import
        return {"consistent": None, "first_mismatch": None, "model_error": f"{type(e).__name__}: {e}"[:300]}
    return {"consistent": bool(out.get("consistent")), "first_mismatch": out.get("first_mismatch"),
            "alloc_retries": out.get("alloc_retries"), "cache_flush_events": out.get("cache_flush_events")}


def _encoded(dev: DeviceData, facts: dict, strings: bytes, compress) -> EncodedGraph:
    blobs = [(name, arr.dtype.str, compress(np.ascontiguousarray(arr).tobytes()))
             for name, arr in {**dev.cols, **dev.tables}.items()]
    extra = facts["extra"]
    return EncodedGraph(index=dev.device, role=ROLE, n_events=dev.n_events, max_size=extra["peak_requested"],
                        buffer_size=extra["peak_reserved"], oom=facts["oom"], consistent=facts["consistent"],
                        strings=strings, blobs=blobs, extra=extra)
