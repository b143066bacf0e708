"""Example traces for a fresh dashboard: two replays that part ways, and one real ggml log.

The replays are llama2-70b at n_ctx 512, n_batch 512 in Metal's concurrency
order under ggml-2023-08-16 and ggml-2023-08-28 (the best-fit change that made
the real buffer fit); the log is the legacy harness run that runs out of space.
"""
from __future__ import annotations

from alloctrace.server import paths

REPLAY = {"n_ctx": 512, "n_batch": 512, "metal_concurrency": True}
REPLAY_PROFILES = ("ggml-2023-08-16", "ggml-2023-08-28")
PRESET = "llama2-70b"


def example_logs() -> list:
    return sorted(p for p in paths.examples_dir().glob("*.log") if p.is_file())


def seed_examples(store) -> list[str]:
    """Fill an empty store with the examples; a store holding any trace is left alone.
    Returns the ids stored."""
    if store.list():
        return []
    from alloctrace.traces.replay.run import run_replay
    from alloctrace.traces.replay.reuse import stored_ids
    from alloctrace.traces.sources import import_paths
    ids: list[str] = []
    for profile in REPLAY_PROFILES:
        ids += stored_ids(run_replay(PRESET, profile, store=store, **REPLAY))
    for p in example_logs():
        ids += import_paths(store, [p], name=f"{p.name.split('.')[0]} (real ggml log)")
    return ids
