"""Example traces for a fresh dashboard: two replays that part ways, and one real ggml log.

The replays are llama2-70b at n_ctx 512, n_batch 512 in Metal's concurrency order under ggml-2023-08-16 and
ggml-2023-08-28 (the best-fit change that made the real buffer fit); the logs (shipped by the server package)
are the legacy harness run that runs out of space. Seeding adds what a store lacks and nothing twice, so the
store of the README's tour gets them beside its own traces.
"""
from __future__ import annotations

REPLAY = {"n_ctx": 512, "n_batch": 512, "metal_concurrency": True}
REPLAY_PROFILES = ("ggml-2023-08-16", "ggml-2023-08-28")
PRESET = "llama2-70b"
TAG = "example=yes"


def seed_examples(store, logs) -> list[str]:
    """Store the examples `store` does not hold yet (the replays once each, each log once); the ids stored."""
    from alloctrace.traces.replay.reuse import store_once
    from alloctrace.traces.replay.run import replay
    from alloctrace.traces.sources import import_files

    held = {(t["name"], t["source"]) for t in store.list()}
    ids: list[str] = []
    for profile in REPLAY_PROFILES:
        r = replay(PRESET, profile, **REPLAY)
        if not store_once(r, store):
            ids.append(r.trace_id)
    for p in logs:
        name = f"{p.name.split('.')[0]} (real ggml log)"
        if (name, "ggml-log") in held:
            continue
        ids += [s["id"] for s in import_files(store, [p], name=name) if not s.get("stored_before")]
    return ids
