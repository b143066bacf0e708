"""How a compute buffer's size moves with the config: one replay per (profile, n_ctx, n_batch) point.

Each point replays a preset as the program did (measure, size the buffer, eval) and
reports the measure graph's max_size, whether an allocator ran out of space, and
the families that dominate the measure graph's peak. Points come back in input
order (profiles outermost, then n_ctx, then n_batch); for each profile the first
failing point is its out-of-space onset.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from alloctrace.traces.errors import UserError

MAX_POINTS = 256
MAX_VALUES = 64  # per swept parameter
MAX_VALUE = 1 << 22  # n_ctx / n_batch: far beyond any model, small enough to keep sizes in int64
TOP_FAMILIES = 5


@dataclass
class SweepPoint:
    preset: str
    profile: str
    n_ctx: int
    n_batch: int
    max_size: int | None
    oom: bool
    top_families: list  # [{"family", "bytes"}], the measure graph's peak, largest first
    peak_bytes: int | None = None  # the measure graph's own high-water mark
    eval_max_size: int | None = None
    oom_detail: dict | None = None
    error: str | None = None  # a point the replay refused (e.g. n_ctx beyond a GPT-2 model's context)

    def to_json(self) -> dict:
        return {"preset": self.preset, "profile": self.profile, "n_ctx": self.n_ctx, "n_batch": self.n_batch,
                "max_size": self.max_size, "oom": self.oom, "top_families": self.top_families,
                "peak_bytes": self.peak_bytes, "eval_max_size": self.eval_max_size, "oom_detail": self.oom_detail,
                "error": self.error}


def parse_values(text: str | None, name: str) -> list[int | None]:
    """"512,1024" -> [512, 1024]; None -> [None] (the preset's default)."""
    if text is None or str(text).strip() == "":
        return [None]
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdecimal() or not 1 <= int(part) <= MAX_VALUE:
            raise UserError(f"{name} wants integers from 1 to {MAX_VALUE} separated by commas, got {text!r}")
        out.append(int(part))
    if len(out) > MAX_VALUES:
        raise UserError(f"{name}: at most {MAX_VALUES} values, got {len(out)}")
    return out


def sweep_points(profiles: list[str], n_ctx: list, n_batch: list, max_points: int = MAX_POINTS) -> list[tuple]:
    if not profiles:
        raise UserError("a sweep needs at least one profile")
    n = len(profiles) * len(n_ctx) * len(n_batch)
    if n > max_points:
        raise UserError(f"a sweep is limited to {max_points} points, this one has {n}")
    combos = list(product(profiles, n_ctx, n_batch))
    return combos


def run_point(preset, profile: str, n_ctx, n_batch, metal_concurrency: bool = False) -> SweepPoint:
    from alloctrace.allocator.presets import get_preset
    from alloctrace.traces.replay.run import replay
    from alloctrace.traces.explain.peak import ggml_peak
    from alloctrace.traces.store.schema import oom_of

    try:
        p = get_preset(preset)
    except ValueError as e:
        raise UserError(str(e)) from None
    ctx = p.n_ctx if n_ctx is None else n_ctx
    batch = p.n_batch if n_batch is None else n_batch
    try:
        r = replay(p, profile, n_ctx=ctx, n_batch=batch, metal_concurrency=metal_concurrency)
    except UserError as e:
        if "profile" in str(e):  # a wrong profile is wrong for every point: stop
            raise
        return SweepPoint(p.name, profile, ctx, batch, None, False, [], error=str(e))
    peak = ggml_peak(r.measure.events)
    fams = sorted(peak.family_bytes().items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FAMILIES]
    failed = r.measure.alloc.failed or r.eval.alloc.failed
    return SweepPoint(p.name, profile, ctx, batch, r.measure.max_size, failed is not None,
                      [{"family": f, "bytes": b} for f, b in fams], peak.bytes,
                      r.eval.max_size if r.measure.alloc.failed is None else None, oom_of(failed))


def sweep(preset: str, profiles: list[str], n_ctx: list, n_batch: list, metal_concurrency: bool = False,
          progress=None, max_points: int = MAX_POINTS) -> dict:
    """{"points": [...], "oom_onset": [{"profile", "n_ctx", "n_batch"}...]}; `progress(done, total)`."""
    combos = sweep_points(profiles, n_ctx, n_batch, max_points)
    points = []
    for i, (prof, ctx, batch) in enumerate(combos):
        points.append(run_point(preset, prof, ctx, batch, metal_concurrency))
        if progress:
            progress(i + 1, len(combos))
    onset = []
    for prof in dict.fromkeys(profiles):
        first = next((q for q in points if q.profile == prof and q.oom), None)
        if first is not None:
            onset.append({"preset": first.preset, "profile": prof, "n_ctx": first.n_ctx, "n_batch": first.n_batch,
                          "oom": first.oom_detail})
    return {"preset": preset, "metal_concurrency": metal_concurrency, "points": [q.to_json() for q in points],
            "oom_onset": onset}
