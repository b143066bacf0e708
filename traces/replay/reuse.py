"""An identical replay is kept once: a replay stored again with the same name, description and graphs as an
earlier one points at the earlier trace, for the command line and the API alike."""
from __future__ import annotations

PARTS = ("measure", "eval")


def stored_ids(result: dict) -> list[str]:
    """Trace ids a replay stored (its JSON names one per graph: measure and eval share a trace)."""
    ids = []
    for part in PARTS:
        tid = (result.get(part) or {}).get("trace_id")
        if isinstance(tid, str) and tid not in ids:
            ids.append(tid)
    return ids


def earlier_copy(store, result: dict) -> str | None:
    """The id of an older trace that the replay in `result` repeats exactly (name, description, graphs)."""
    ids = stored_ids(result)
    if len(ids) != 1:
        return None
    tid = ids[0]
    meta = store.meta(tid)
    listed = store.list(meta.name)
    mine = next(t for t in listed if t["id"] == tid)
    for t in listed:
        if t["id"] != tid and t["name"] == meta.name and t["source"] == "replay" and t["graphs"] == mine["graphs"]:
            other = store.meta(t["id"])
            if other.extra == meta.extra and other.profile == meta.profile:
                return t["id"]
    return None


def point_at(result: dict, old: str, new: str) -> dict:
    """`result` with every trace id `old` replaced by `new`."""
    for part in PARTS:
        if (result.get(part) or {}).get("trace_id") == old:
            result[part]["trace_id"] = new
    return result


def keep_one_copy(store, result: dict) -> tuple[dict, bool]:
    """Drop the trace a replay just stored when it repeats an earlier one; (result pointing at the kept trace,
    whether an earlier one was reused)."""
    earlier = earlier_copy(store, result)
    if earlier is None:
        return result, False
    new = stored_ids(result)[0]
    store.delete(new)
    return point_at(result, new, earlier), True


def store_once(r, store) -> bool:
    """Store a ReplayResult (replay.run.store_result) unless an identical trace is stored already; either way
    `r.trace_id` names the trace that holds it. True when an earlier trace was reused."""
    from alloctrace.traces.replay.run import store_result

    store_result(r, store)
    new = r.trace_id
    earlier = earlier_copy(store, {"measure": {"trace_id": new}})
    if earlier is None:
        return False
    store.delete(new)
    r.trace_id = earlier
    return True
