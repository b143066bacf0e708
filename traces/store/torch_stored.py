"""Reading a stored torch trace back: per-device columns and facts (what views and the CUDA model use).

The layout's codes are defined here (the source writes them, the analyses read them): `action` is an index
into ACTIONS, a block's state an index into BLOCK_STATES.
"""
from __future__ import annotations

import numpy as np

from alloctrace.traces.store.damage import _json
from alloctrace.traces.store.kinds import TORCH, require_kind

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot")
ACTION_CODE = {a: i for i, a in enumerate(ACTIONS)}
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM, SNAPSHOT = \
    range(len(ACTIONS))
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
ENTRY_COLUMNS = ("action", "addr", "size", "stream", "time_us", "stack", "meta", "compile")
# every blob of a device row, in the order the source stores them, with its dtype; device_free only with an OOM
LAYOUT = (("action", "|i1"), ("addr", "<i8"), ("size", "<i8"), ("stream", "<i8"), ("time_us", "<i8"),
          ("stack", "<i4"), ("meta", "<i4"), ("compile", "<i4"), ("device_free", "<i8"),
          ("frame_name", "<i4"), ("frame_file", "<i4"), ("frame_line", "<i8"), ("stack_offsets", "<i8"),
          ("stack_frames", "<i4"),
          *((f"seg_{k}", "<i8") for k in ("address", "total", "allocated", "active", "requested", "stream", "small",
                                          "pool_a", "pool_b", "expandable", "stack", "block0")),
          *((f"blk_{k}", "<i8") for k in ("address", "size", "requested", "state", "stack")),
          ("ann_stage", "|i1"), ("ann_name", "<i4"), ("ann_time", "<i8"))
JSONL_FORMAT, JSONL_VERSION = "alloctrace-torch-jsonl", 2  # the full-fidelity JSON Lines of a PyTorch trace


def _load(store, trace_id: str, device: int):
    tid, _ = require_kind(store, str(trace_id).partition(":")[0], TORCH)
    row, cols, table = store._raw(tid, device)
    return tid, row, cols, table


def device_columns(store, trace_id: str, device: int) -> dict[str, np.ndarray]:
    """The device's trace entries as columns, one row per entry, in trace order.

    action: int8 code, index into ACTIONS; addr: int64 (-1 for oom entries); size: int64 (requested
    bytes; segment size for segment_*); stream, time_us: int64; stack: int32 stack id (-1: no frames);
    meta: int32 string code of user_metadata (-1: empty); compile: int32 string code of compile_context;
    device_free: int64, the GPU's free memory on oom rows, -1 elsewhere."""
    _, row, cols, _ = _load(store, trace_id, device)
    n = row[2]
    out = {k: cols[k] for k in ENTRY_COLUMNS}
    out["device_free"] = cols["device_free"] if "device_free" in cols else np.full(n, -1, dtype=np.int64)
    return out


def device_info(store, trace_id: str, device: int) -> dict:
    """Everything about a device but its entries: settings, peaks, OOM, strings, stacks, segments at snapshot."""
    tid, row, cols, table = _load(store, trace_id, device)
    info = info_from(_json(row[7], tid, device, "extra", dict), cols, table)  # a damaged row: one line
    info["n_events"] = row[2]
    info["oom"] = None if row[5] is None else _json(row[5], tid, device, "oom", dict)
    info["consistent"] = None if row[6] is None else bool(row[6])
    return info


def info_from(extra: dict, tables: dict[str, np.ndarray], strings: list[str] | None = None) -> dict:
    """device_info's fields from a row's extra and blobs (also used before the row is stored)."""
    info = dict(extra)
    info["actions"] = ACTIONS
    info["strings"] = strings
    info["stacks"] = {"frame_name": tables["frame_name"], "frame_file": tables["frame_file"],
                      "frame_line": tables["frame_line"], "offsets": tables["stack_offsets"],
                      "frames": tables["stack_frames"]}
    info["segments"] = segments_at_snapshot(tables)
    info["annotations"] = {"stage": tables["ann_stage"], "name": tables["ann_name"], "time_us": tables["ann_time"]}
    return info


def segments_at_snapshot(tables: dict[str, np.ndarray]) -> list[dict]:
    """The snapshot's segments (list of dicts with their blocks), as torch reported them."""
    out = []
    starts = tables["seg_block0"].tolist()
    blk = {k: tables[f"blk_{k}"].tolist() for k in ("address", "size", "requested", "state", "stack")}
    for k, addr in enumerate(tables["seg_address"].tolist()):
        blocks = [{"address": blk["address"][j], "size": blk["size"][j], "requested_size": blk["requested"][j],
                   "state": BLOCK_STATES[blk["state"][j]] if blk["state"][j] < len(BLOCK_STATES) else "other",
                   "stack": blk["stack"][j]} for j in range(starts[k], starts[k + 1])]
        out.append({"address": addr, "total_size": int(tables["seg_total"][k]),
                    "allocated_size": int(tables["seg_allocated"][k]), "active_size": int(tables["seg_active"][k]),
                    "requested_size": int(tables["seg_requested"][k]), "stream": int(tables["seg_stream"][k]),
                    "segment_type": "small" if tables["seg_small"][k] else "large",
                    "segment_pool_id": (int(tables["seg_pool_a"][k]), int(tables["seg_pool_b"][k])),
                    "is_expandable": bool(tables["seg_expandable"][k]), "stack": int(tables["seg_stack"][k]),
                    "blocks": blocks})
    return out


def device_tables(store, trace_id: str, device: int) -> tuple[dict[str, np.ndarray], list[str], dict]:
    """All blobs of the device row, its string table and its extra (for the views)."""
    tid, row, cols, table = _load(store, trace_id, device)
    return cols, table, _json(row[7], tid, device, "extra", dict)


def torch_summary(store, trace_id: str) -> dict:
    """The `import --json` shape of one stored torch trace."""
    s = store.summary(trace_id)
    extras = store.graph_extras(s["id"])
    devices = []
    for g in s["graphs"]:
        oom = g["oom"]
        d = {"device": g["index"], "n_events": g["n_events"], "peak_requested": g["max_size"],
             "peak_reserved": g["buffer_size"],
             "oom": None if oom is None else {k: oom[k] for k in ("requested", "allocated", "reserved")}}
        ex = extras.get(g["index"], {})
        if g["consistent"] is not None or "model_error" in ex:
            d["consistent"] = g["consistent"]
            if ex.get("first_mismatch") is not None:
                d["first_mismatch"] = ex["first_mismatch"]
            if ex.get("model_error"):
                d["model_error"] = ex["model_error"]
        devices.append(d)
    return {"id": s["id"], "name": s["name"], "source": s["source"], "devices": devices}


def curves(cols: dict[str, np.ndarray], baseline: tuple[int, int] = (0, 0)) -> tuple[np.ndarray, np.ndarray]:
    """(requested bytes, reserved bytes) after each entry, on top of what existed before the trace began."""
    a, size = cols["action"], cols["size"]
    req = np.where(a == ALLOC, size, 0) - np.where(a == FREE_REQUESTED, size, 0)
    res = (np.where((a == SEGMENT_ALLOC) | (a == SEGMENT_MAP), size, 0)
           - np.where((a == SEGMENT_FREE) | (a == SEGMENT_UNMAP), size, 0))
    return np.cumsum(req) + baseline[0], np.cumsum(res) + baseline[1]


NO_CATEGORIES = ("a memory snapshot records sizes, addresses and stacks, not what a tensor is for; "
                 "`alloctrace plan --vary` stores the bytes per category at the peak with the run it keeps")


def categories(store, trace_id: str) -> dict:
    """Bytes per category (parameters, gradients, optimizer state, activations, ...) at the peak allocated, where
    the trace knows them: a `plan --vary` run keeps them for every point of its search, and the stored run is
    the point at `stored_value`. {"known": False, "why": ...} for any other trace."""
    kept = (store.meta(trace_id).extra or {}).get("plan_vary") or {}
    point = next((p for p in kept.get("points") or [] if p.get("value") == kept.get("stored_value")), None)
    if not point or not point.get("categories"):
        return {"known": False, "why": NO_CATEGORIES}
    cats = {str(k): int(v) for k, v in point["categories"].items()}
    return {"known": True, "name": kept.get("name"), "value": point["value"], "fits": point.get("fits"),
            "peak_allocated": point.get("peak_allocated"), "total": sum(cats.values()),
            "categories": dict(sorted(cats.items(), key=lambda kv: (-kv[1], kv[0])))}
