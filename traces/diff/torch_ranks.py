"""The ranks of one distributed job side by side: peak, reserved, fragmentation, the rank that ran out of memory,
and what differed between the highest and the lowest (the ranks are a trace's devices: sources/ranks.py)."""
from __future__ import annotations

import numpy as np

from alloctrace.traces.diff.torch_snapshots import diff
from alloctrace.traces.state.torch_device import DEFAULT_SKIP, load_device
from alloctrace.traces.store.kinds import TORCH, require_kind


def compare(store, trace_id: str, skip=None, top: int = 10) -> dict:
    """Per rank: peak requested and reserved, fragmentation at the reserved peak (reserved − requested there),
    the OOM; the rank with the highest peak (or the one that ran out) against the lowest, by call site."""
    skip = DEFAULT_SKIP if skip is None else skip
    require_kind(store, trace_id, TORCH)
    s = store.summary(trace_id)
    rows, devs = [], {}
    for g in s["graphs"]:
        dev = load_device(store, s["id"], g["index"])
        devs[g["index"]] = dev
        req, res = dev.curves()
        k = int(np.argmax(res)) if dev.n else 0
        peak_res = int(res[k]) if dev.n else 0
        at_res = int(req[k]) if dev.n else 0
        oom = g["oom"]
        rows.append({"device": g["index"], "rank": dev.extra.get("rank", g["index"]),
                     "cuda_device": dev.extra.get("cuda_device", g["index"]), "n_events": dev.n,
                     "peak_requested": int(req.max()) if dev.n else 0, "peak_reserved": peak_res,
                     "peak_reserved_event": k if dev.n else None,
                     "partial": bool((dev.extra.get("partial") or {}).get("partial")),
                     "fragmentation": peak_res - at_res, "fragmentation_share": (peak_res - at_res) / peak_res
                     if peak_res else 0.0,
                     "oom": None if oom is None else {f: oom.get(f) for f in ("event", "requested", "allocated",
                                                                              "reserved", "n_ooms")}})
    out = {"id": s["id"], "name": s["name"], "ranks": rows, "oom_ranks": [r["rank"] for r in rows if r["oom"]],
           "compared": None}
    if len(rows) >= 2:
        hi = next((r for r in rows if r["oom"]), None) or max(rows, key=lambda r: (r["peak_requested"], -r["rank"]))
        lo = min((r for r in rows if r is not hi), key=lambda r: (r["peak_requested"], r["rank"]))
        d = diff(devs[lo["device"]], devs[hi["device"]], skip=skip, top=top)
        al = d["alignment"]
        out["compared"] = {"a_rank": lo["rank"], "b_rank": hi["rank"],
                           "why": "ran out of memory" if hi["oom"] else "highest peak",
                           "delta_requested": d["delta_requested"],
                           "delta_reserved": d["reserved"]["delta_peak_reserved"],
                           "same_sequence": al["same_sequence"], "paired": al["paired"], "only_a": al["only_a"],
                           "only_b": al["only_b"], "grew": al["grew"], "shrank": al["shrank"],
                           "by_call_site": [r for r in d["by_call_site"] if r["delta"]][:top]}
    return out
