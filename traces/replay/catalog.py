"""What the faces may offer a user to replay: the model presets, the allocator generations (profiles) and
their names. The command line and the API list and check these through here, never through allocator/."""
from __future__ import annotations

import dataclasses

from alloctrace.allocator.profiles import DEFAULT_PROFILE, PRESET_PROFILES, PROFILES, names as profile_names

__all__ = ["DEFAULT_PROFILE", "PROFILES", "profile_names", "catalog_json", "preset", "preset_lines",
           "presets_json"]


def _presets() -> dict:
    """The presets, imported when asked for: building their registry costs commands that only name profiles."""
    from alloctrace.allocator.presets import PRESETS
    return PRESETS


def preset(name: str):
    """The preset called `name`, or None."""
    return _presets().get(name)


def presets_json() -> list[dict]:
    return [p.to_json() for p in _presets().values()]


def catalog_json() -> dict:
    """The model presets replay can run, the allocator profiles it accepts, and every generation."""
    return {"presets": presets_json(), "profiles": list(PRESET_PROFILES),
            "generations": [p.to_json() for p in PROFILES.values()]}


def preset_lines() -> list[str]:
    """Two lines a preset: its name, family, defaults and hyper-parameters; then its description."""
    out = []
    for p in _presets().values():
        hp = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(p.hparams).items())
        out.append(f"{p.name:<14} {p.family:<5} n_ctx={p.n_ctx} n_batch={p.n_batch}  {hp}")
        out.append(f"{'':<14} {p.description}")
    return out
