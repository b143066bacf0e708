"""The API's limits and the JSON it shapes from replay results and the registries."""
from __future__ import annotations

MAX_PAGE = 5000
MAX_SHAPES = 20000
MAX_POINTS = 10000


def stored_ids(result: dict) -> list[str]:
    """Trace ids a replay stored (its JSON names one per graph: measure and eval share a trace)."""
    ids = []
    for part in ("measure", "eval"):
        tid = (result.get(part) or {}).get("trace_id")
        if isinstance(tid, str) and tid not in ids:
            ids.append(tid)
    return ids


def presets() -> dict:
    """The model presets replay can run, the allocator profiles it accepts, and every generation."""
    from alloctrace.allocator.presets import PRESETS
    from alloctrace.allocator.profiles import PRESET_PROFILES, PROFILES
    return {"presets": [p.to_json() for p in PRESETS.values()], "profiles": list(PRESET_PROFILES),
            "generations": [p.to_json() for p in PROFILES.values()]}
