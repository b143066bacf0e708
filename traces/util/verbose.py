"""What a command did, for `-v/--verbose` (and the server's debug log): facts noted where they are decided
(which store backend and where, which budgets, which reader, which generation profile) and the time each stage
took. Noting is a list append, so the code that notes never asks whether anyone will read it. The lists live in a
context variable: each server request (reset at its start; worker threads copy its context) keeps its own."""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from urllib.parse import urlsplit, urlunsplit

_NOTES: ContextVar[tuple[list, list] | None] = ContextVar("alloctrace_verbose", default=None)


def _notes() -> tuple[list, list]:
    got = _NOTES.get()
    if got is None:
        got = ([], [])
        _NOTES.set(got)
    return got


def reset() -> None:
    """Start a new record (a command, a request)."""
    _NOTES.set(([], []))


def note(key: str, value) -> None:
    """Record one fact; the same fact noted again with the same value is kept once."""
    facts = _notes()[0]
    item = (key, str(value))
    if item not in facts:
        facts.append(item)


@contextmanager
def stage(name: str):
    """Time the block as stage `name` (kept also when it raises: the time to the failure is a fact too)."""
    stages = _notes()[1]
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stages.append((name, time.perf_counter() - t0))


def hide_password(url: str) -> str:
    """A store URL fit to print: `postgresql://u:secret@h/db` -> `postgresql://u:***@h/db`; a libpq
    `key=value` string has its password=... replaced the same way."""
    if "://" in url:
        try:
            parts = urlsplit(url)
            parts.password  # noqa: B018 - parsing the netloc is what fails on a malformed address
        except ValueError:  # malformed (`[::1` without its bracket): nothing after the scheme is shown
            return url.split("://", 1)[0] + "://***"
        if parts.password is not None:
            host = parts.netloc.rpartition("@")[2]
            return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
        return url
    return " ".join("password=***" if w.lower().startswith("password=") else w for w in url.split())


def lines() -> list[str]:
    """The facts, then the stages with their milliseconds, one per line."""
    facts, stages = _notes()
    out = [f"{k}: {v}" for k, v in facts]
    out += [f"stage {name}: {s * 1000:.1f} ms" for name, s in stages]
    return out
