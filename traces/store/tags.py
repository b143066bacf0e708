"""Tags: strings `key=value` in a trace's `tags` list (`commit=abc123`, `model=llama`, `config=fa-on`).

A trace keeps any other strings it had as tags; only `key=value` ones take part in filters and in the
pairing of `compare`. A key is a short identifier; a value is any printable text without newlines.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from alloctrace.traces.errors import UserError

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
MAX_VALUE = 200
MAX_TAGS = 64


def parse_tag(text: str) -> str:
    """'key=value' checked and returned as stored; UserError for anything else."""
    key, sep, value = str(text).partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not KEY_RE.match(key):
        raise UserError(f"bad tag {text!r}: expected key=value (key: letters, digits, _ . -)")
    if not value or len(value) > MAX_VALUE or not value.isprintable():
        raise UserError(f"bad tag {text!r}: the value must be 1-{MAX_VALUE} printable characters")
    return f"{key}={value}"


def parse_tags(texts: Iterable[str] | None) -> list[str]:
    """Several --tag values; a key given twice keeps its last value."""
    out: dict[str, str] = {}
    for t in texts or ():
        tag = parse_tag(t)
        out[tag.partition("=")[0]] = tag
    if len(out) > MAX_TAGS:
        raise UserError(f"at most {MAX_TAGS} tags")
    return list(out.values())


def with_tags(existing: Iterable, tags: Iterable[str]) -> list:
    """`existing` tags with `tags` added; a key=value tag replaces an existing one with its key."""
    tags = list(tags)
    keys = {t.partition("=")[0] for t in tags}
    kept = [t for t in existing if not (isinstance(t, str) and "=" in t and t.partition("=")[0] in keys)]
    return kept + [t for t in tags if t not in kept]


def as_dict(tags: Iterable) -> dict[str, str]:
    """The key=value tags of a trace as a dict (other tags left out)."""
    out = {}
    for t in tags or ():
        if isinstance(t, str) and "=" in t:
            k, _, v = t.partition("=")
            out[k] = v
    return out


def split_query(q: str | None, tags: Iterable[str] = ()) -> tuple[str | None, list[str]]:
    """A list query: `key=value` words are tags to carry, the rest a name to contain."""
    wanted = [parse_tag(t) for t in tags]
    if q and "=" in q:
        words = q.split()
        if all("=" in w for w in words):
            return None, wanted + [parse_tag(w) for w in words]
    return q, wanted


def matches(tags: Iterable, wanted: Iterable[str]) -> bool:
    """The trace's tags carry every wanted tag."""
    have = set(t for t in tags or () if isinstance(t, str))
    return all(w in have for w in wanted)
