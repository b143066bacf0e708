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
    log's first graph walk (its allocation sizes are padded to the generation's alignment)."""
    sizes = [e.size for e in first.items if isinstance(e, Event) and e.kind == "alloc" and e.size] if first else []
    rows = [p for p in PROFILES.values() if p.log_style == log_style(f)]
    for line in f.asserts:
        for p in rows:
            if line in p.assert_lines:
                return p.name
    if len({p.alignment for p in rows}) > 1:  # the widest alignment every size is padded to
        for p in sorted(rows, key=lambda p: -p.alignment):
            if sizes and all(s % p.alignment == 0 for s in sizes):
                return p.name
        return rows[-1].name
    # a fresh allocator with a last-block fallback has only its last block, so its first choice prints -1
    skips_last = f.first_block == -1
    return [p for p in rows if p.best_fit_skips_last == skips_last or len(rows) == 1][-1].name
