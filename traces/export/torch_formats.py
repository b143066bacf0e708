"""PyTorch traces out: Chrome trace JSON (opens in Perfetto and chrome://tracing) and JSON Lines.

Chrome trace: one process per device (a rank's device says its rank), one thread per CUDA stream. Each
allocation is an async slice (`b`/`e`, id = "PID.ENTRY" of its alloc) on its stream's track, named by its call site,
from its `alloc` to its `free_requested` (still live at the snapshot: to the last entry, `freed: false`);
segment events and OOMs are instant events on the stream; two counters per device: allocated (requested
bytes, as the timeline) and reserved. Times are the entries' `time_us` from the first entry, in
microseconds, as the format wants.

JSON Lines: everything the stored trace holds, re-importable with every view equal (torch_jsonl.py writes it).
"""
from __future__ import annotations

import json
from typing import IO

import numpy as np

from alloctrace.traces.store.torch_stored import ACTIONS, ALLOC, FREE_REQUESTED, OOM, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP
from alloctrace.traces.state.torch_device import DEFAULT_SKIP, Device, load_device
from alloctrace.traces.export import torch_jsonl

FORMATS = ("chrome", "jsonl")  # what this module writes; the registry (formats.py) lists them for the faces
SEGMENT_ACTIONS = (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)


def devices(store, tid: str) -> list[Device]:
    return [load_device(store, tid, g["index"]) for g in store.summary(tid)["graphs"]]


def device_title(dev: Device) -> str:
    rank = dev.extra.get("rank")
    return f"rank {rank} (cuda:{dev.extra.get('cuda_device', dev.device)})" if rank is not None else f"cuda:{dev.device}"


def chrome_events(dev: Device, pid: int, t0: int, skip=DEFAULT_SKIP) -> list[dict]:
    """The events of one device (see the module's docstring)."""
    c = dev.cols
    n = dev.n
    ts = (c["time_us"] - t0).astype(np.int64) if n else c["time_us"]
    streams = sorted(set(c["stream"].tolist()))
    tid_of = {s: i + 1 for i, s in enumerate(streams)}
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": device_title(dev)}},
                       {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}]
    for s, t in tid_of.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": f"stream {s:#x}"}})
    al = dev.allocations()
    last = int(ts[-1]) if n else 0
    for start, end, size, addr, stack in zip(al.start.tolist(), al.end.tolist(), al.size.tolist(),
                                             al.addr.tolist(), al.stack.tolist()):
        name = dev.label(stack, start, skip)
        tid = tid_of[int(c["stream"][start])]
        common = {"cat": "allocation", "name": name, "id": f"{pid}.{start}", "pid": pid, "tid": tid}
        out.append({**common, "ph": "b", "ts": int(ts[start]),
                    "args": {"size": size, "address": hex(addr), "entry": start}})
        out.append({**common, "ph": "e", "ts": int(ts[end]) if end < n else last,
                    "args": {"freed": end < n, "free_entry": end if end < n else None}})
    a = c["action"]
    for k in np.flatnonzero(np.isin(a, SEGMENT_ACTIONS) | (a == OOM)).tolist():
        action = ACTIONS[int(a[k])]
        args = {"size": int(c["size"][k]), "entry": k}
        if a[k] == OOM:
            free = int(c["device_free"][k]) if "device_free" in c else -1
            args.update(device_free=free if free >= 0 else None, site=dev.label(int(c["stack"][k]), k, skip))
        else:
            args["address"] = hex(int(c["addr"][k]))
        out.append({"ph": "i", "s": "p" if a[k] == OOM else "t", "cat": "segment" if a[k] != OOM else "oom",
                    "name": "OUT OF MEMORY" if a[k] == OOM else action, "pid": pid, "tid": tid_of[int(c["stream"][k])],
                    "ts": int(ts[k]), "args": args})
    req, res = dev.curves()
    changes = np.flatnonzero(np.isin(a, (ALLOC, FREE_REQUESTED) + SEGMENT_ACTIONS))
    for k in changes.tolist():
        out.append({"ph": "C", "name": "memory", "pid": pid, "ts": int(ts[k]),
                    "args": {"allocated": int(req[k]), "reserved": int(res[k])}})
    return out


def write_chrome(store, tid: str, out: IO[str], skip=DEFAULT_SKIP):
    devs = devices(store, tid)
    t0 = min((int(d.cols["time_us"].min()) for d in devs if d.n), default=0)
    meta = store.meta(tid)
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    out.write(json.dumps({"trace": tid, "name": meta.name, "source": "torch", "time_origin_us": t0}))
    out.write(', "traceEvents": [')
    first = True
    for pid, dev in enumerate(devs, 1):
        for ev in chrome_events(dev, pid, t0, skip):
            out.write(("" if first else ",\n") + json.dumps(ev))
            first = False
    out.write("]}\n")


write_jsonl = torch_jsonl.write_jsonl  # the registry (formats.py) finds each format's writer here
