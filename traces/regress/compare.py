"""Two commits' traces, compared buffer by buffer: what `alloctrace compare` and GET /api/compare answer.

The traces tagged with the base (say `commit=A`) and with the head (`commit=B`) are paired by their
other key=value tags (model, config, a sweep's FLAG=VALUE, ...), leaving out the keys that chose the sides, `order`
and `sweep` (a sweep's id) and `branch` (a pull request's branch is not main, its commits still pair).
Each trace's buffers are its largest size per buffer type (a recording names its buffer types and
the sizes ggml reported; other traces have one compute buffer: buffer_size, else max_size), taken
from the graph that first reached it. A buffer that changed gets the size attribution `diff`
computes between those two graphs (traces.explain.size_attribution), so a growth names its cause.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from alloctrace.traces.errors import UserError
from alloctrace.traces.store.kinds import TORCH, kind_of_source

from alloctrace.traces.store.tags import as_dict, parse_tag

NOT_PAIRED_BY = ("order", "sweep", "branch")  # tags that order or group runs, never ones that tell configs apart
MAX_TRACES = 2000  # per side: the work a compare may cause


@dataclass
class Threshold:
    """How much a buffer may grow before the comparison fails: bytes, or percent of the base size."""

    bytes: int = 0
    percent: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> "Threshold":
        if text is None or str(text).strip() in ("", "0"):
            return cls()
        t = str(text).strip()
        if t.endswith("%"):
            try:
                pct = float(t[:-1])
            except ValueError:
                pct = -1.0
            if not 0 <= pct <= 1e6:
                raise UserError(f"--threshold: not a percentage: {text!r} (e.g. 1%)")
            return cls(percent=pct)
        m = re.fullmatch(r"(\d+)\s*([kmgt]?)(i?b)?", t.lower())
        if not m:
            raise UserError(f"--threshold: not a size or a percentage: {text!r} (e.g. 1MiB, 4096, 1%)")
        return cls(bytes=int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2)])

    def exceeded(self, base: int, head: int) -> bool:
        grew = head - base
        if grew <= 0:
            return False
        if self.percent is not None:
            return grew * 100 > self.percent * base
        return grew > self.bytes

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.bytes:,} B"


@dataclass
class BufferChange:
    buffer: str
    base: int | None
    head: int | None
    base_graph: int | None = None
    head_graph: int | None = None
    attribution: dict | None = None

    @property
    def delta(self) -> int | None:
        return None if self.base is None or self.head is None else self.head - self.base

    def cause(self) -> dict | None:
        """The family that grew most (the attribution's largest positive delta), None without growth."""
        rows = [r for r in (self.attribution or {}).get("families", []) if r["delta"] > 0]
        return max(rows, key=lambda r: (r["delta"], r["family"]), default=None)

    def to_json(self) -> dict:
        cause = self.cause()
        return {"buffer": self.buffer, "base": self.base, "head": self.head, "delta": self.delta,
                "base_graph": self.base_graph, "head_graph": self.head_graph,
                "cause": cause["family"] if cause and (self.delta or 0) > 0 else None,
                "attribution": self.attribution}


@dataclass
class Pair:
    key: dict  # the tags both traces share, beyond the sides' own
    base_id: str
    head_id: str
    buffers: list[BufferChange] = field(default_factory=list)
    grew: bool = False

    def to_json(self) -> dict:
        return {"tags": self.key, "base": self.base_id, "head": self.head_id, "grew": self.grew,
                "buffers": [b.to_json() for b in self.buffers]}


GREW, UNPAIRED = 1, 3  # exit statuses (2 is bad input): a CI job fails on either


@dataclass
class Comparison:
    base: list[str]
    head: list[str]
    threshold: Threshold
    pairs: list[Pair]
    only_base: list[dict]
    only_head: list[dict]
    baseline: dict | None = None  # how --base-ref chose the base (traces.regress.baseline.Baseline.to_json)

    @property
    def failed(self) -> bool:
        return any(p.grew for p in self.pairs)

    @property
    def unpaired(self) -> bool:
        """Nothing paired, or a side has traces without a partner: a renamed tag or a config that stopped
        being recorded, which would otherwise pass as "no growth"."""
        return not self.pairs or bool(self.only_base or self.only_head)

    def status(self, allow_unpaired: bool = False) -> int:
        """0, GREW, or UNPAIRED (unless allowed; nothing paired at all is never allowed); growth comes first."""
        if self.failed:
            return GREW
        if not self.pairs or (self.unpaired and not allow_unpaired):
            return UNPAIRED
        return 0

    def to_json(self) -> dict:
        return {"base": self.base, "head": self.head, "threshold": str(self.threshold), "failed": self.failed,
                "unpaired": self.unpaired, "baseline": self.baseline,
                "pairs": [p.to_json() for p in self.pairs], "only_base": self.only_base, "only_head": self.only_head}


def side_tags(texts) -> list[str]:
    tags = [parse_tag(t) for t in (texts if isinstance(texts, (list, tuple)) else [texts]) if t]
    if not tags:
        raise UserError("compare: each side needs a tag, e.g. --base commit=abc123")
    return tags


BUFFER_KEYS = ("buffer_types", "real_sizes", "gallocr")  # what trace_buffers reads of a graph's extra


def trace_buffers(store, summary: dict, extras: dict | None = None) -> dict[str, tuple[int, int]]:
    """buffer name -> (largest size, the first graph that reached it); `extras`: the trace's graph extras
    when the caller read them already (Store.graph_extras_of)."""
    out: dict[str, tuple[int, int]] = {}
    if extras is None:
        extras = store.graph_extras(summary["id"]) if summary["source"] == "recording" else {}
    for g in summary["graphs"]:
        ex = extras.get(g["index"]) or {}
        types, sizes = ex.get("buffer_types") or [], ex.get("real_sizes") or []
        if types and sizes:
            serial = ex.get("gallocr") or 0
            named = [(t.get("name") or f"buffer {i}") + (f" (gallocr {serial})" if serial else "")
                     for i, t in enumerate(types)]
            found = list(zip(named, sizes))
        elif kind_of_source(summary["source"]) == TORCH:
            found = [(f"device {g['index']} reserved", g["buffer_size"] or g["max_size"])]
        else:
            found = [("compute", g["buffer_size"] if g["buffer_size"] is not None else g["max_size"])]
        for name, size in found:
            if size is not None and (name not in out or size > out[name][0]):
                out[name] = (int(size), g["index"])
    return out


def _pair_key(summary: dict, side_keys: set[str]) -> tuple:
    tags = as_dict(summary["tags"])
    return tuple(sorted((k, v) for k, v in tags.items() if k not in side_keys and k not in NOT_PAIRED_BY))


def _side(store, tags: list[str], side_keys: set[str]) -> dict[tuple, dict]:
    """The side's newest trace per pairing key."""
    found = store.list(tags=tags)
    if not found:
        raise UserError(f"compare: no trace is tagged {' '.join(tags)}")
    if len(found) > MAX_TRACES:
        raise UserError(f"compare: {len(found)} traces are tagged {' '.join(tags)}; at most {MAX_TRACES}")
    out: dict[tuple, dict] = {}
    for s in found:  # newest first: a rerun stands for its commit
        out.setdefault(_pair_key(s, side_keys), s)
    return out


def compare(store, base, head, threshold: Threshold | str | None = None) -> Comparison:
    """Pair, measure and attribute (the module's docstring); `threshold` decides `failed`."""
    from alloctrace.traces.diff.graphs import diff_refs

    base, head = side_tags(base), side_tags(head)
    if not isinstance(threshold, Threshold):
        threshold = Threshold.parse(threshold)
    keys = {t.partition("=")[0] for t in base + head}
    a, b = _side(store, base, keys), _side(store, head, keys)
    pairs = []
    for key in sorted(set(a) & set(b)):
        sa, sb = a[key], b[key]
        pair = Pair(dict(key), sa["id"], sb["id"])
        ba, bb = trace_buffers(store, sa), trace_buffers(store, sb)
        for name in sorted(set(ba) | set(bb)):
            (x, gx), (y, gy) = ba.get(name, (None, None)), bb.get(name, (None, None))
            change = BufferChange(name, x, y, gx, gy)
            if x is not None and y is not None and x != y:
                change.attribution = diff_refs(store, f"{sa['id']}:{gx}", f"{sb['id']}:{gy}").size_attribution
                if threshold.exceeded(x, y):
                    pair.grew = True
            pair.buffers.append(change)
        pairs.append(pair)
    brief = lambda s: {"id": s["id"], "name": s["name"], "tags": s["tags"]}  # noqa: E731
    return Comparison(base, head, threshold, pairs, [brief(a[k]) for k in sorted(set(a) - set(b))],
                      [brief(b[k]) for k in sorted(set(b) - set(a))])
