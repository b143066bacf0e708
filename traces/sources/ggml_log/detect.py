"""Which ggml generation wrote a log: from its message style, assert lines and first walk's sizes.

Both import paths ask it (import_log.py, fastlog.py), so it sits apart from either.
"""
from __future__ import annotations

from alloctrace.allocator.events import Event
from alloctrace.allocator.profiles import PROFILES

from alloctrace.traces.sources.ggml_log.drafts import Draft, Features


def log_style(f: Features) -> str:
    """How the log's allocating lines look (Profile.log_style)."""
    return "chunk" if f.chunk else "offset" if (f.offset or f.parent_line) else "addr" if f.addr else "block"


def detect_generation(f: Features, first: Draft | None = None) -> str:
    """The generation (PROFILES row) a log's message style and fingerprints point to; `first` is the
    log's first graph walk (its allocation sizes are padded to the generation's alignment). Where
    several fit, the newest (see `generation_candidates`)."""
    return generation_candidates(f, first)[0]


def generation_candidates(f: Features, first: Draft | None = None) -> list[str]:
    """Every generation the log fits, newest first: one name when its lines tell."""
    events = [e for e in first.items if isinstance(e, Event)] if first else []
    sizes = [e.size for e in events if e.kind == "alloc" and e.size]
    rows = [p for p in PROFILES.values() if p.log_style == log_style(f)]
    for line in f.asserts:
        for p in rows:
            if line in p.assert_lines:
                return [p.name]
    if len({p.alignment for p in rows}) > 1:  # sizes are padded to the generation's alignment
        fits = [p for p in rows if sizes and all(s % p.alignment == 0 for s in sizes)]
        if not fits:
            return [rows[-1].name]
        rows = fits
    if len(rows) > 1 and _leaf_after_node(events):  # data-less leafs just before their first user
        rows = [p for p in rows if not p.leafs_first] or rows
    # a fresh allocator with a last-block fallback has only its last block, so its first choice prints -1
    skips_last = f.first_block == -1
    rows = [p for p in rows if p.best_fit_skips_last == skips_last] or rows
    return [p.name for p in reversed(rows)]


def _leaf_after_node(events: list) -> bool:
    """A tensor the walk never executes (a leaf) allocated after one it does: ggml before 2025-09
    (which allocates every data-less leaf first)."""
    executed = {e.tensor for e in events if e.kind == "exec"}
    node_seen = False
    for e in events:
        if e.kind == "alloc":
            if e.tensor in executed:
                node_seen = True
            elif node_seen:
                return True
    return False


AMBIGUITY = {  # what tells two generations apart that a log may not show
    frozenset({"ggml-2024-02", "ggml-2025-09"}):
        "ggml-2024-02 pads to 64 bytes and its CPU buffer is max_size + 64, ggml-2025-09 pads to 32 and its "
        "buffer is max_size; this log's sizes are all multiples of 64 and no leaf is allocated after a node",
    frozenset({"ggml-2023-08-22", "ggml-2023-08-28"}):
        "ggml-2023-08-22 walks a parse_seq as a pure reorder with immediate frees, ggml-2023-08-28 defers frees "
        "to its -1 barriers; only an out-of-space assert's line (139 or 140) tells them apart; the sizes are exact "
        "under either reading (0 bytes uncertain: this log style prints every tensor's address, the readings "
        "differ only in when a tensor is freed, which changes why a tensor went where, not how much was used)",
    frozenset({"ggml-2026-08-21", "ggml-head"}):
        "ggml-head (ggml 0.25.3) lets CLAMP reuse its parent, ggml-2026-08-21 (ggml 0.21.0) makes it a view; "
        "the logs look the same",
}


def ambiguity_note(candidates: list[str]) -> str | None:
    """One line naming the candidates and what differs, or None when there is one."""
    if len(candidates) < 2:
        return None
    why = AMBIGUITY.get(frozenset(candidates[:2]), "their logs look the same")
    return (f"the log fits {' and '.join(candidates)}: read as {candidates[0]} (the newer); {why}; "
            f"--generation decides")
