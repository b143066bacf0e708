"""Pause Python's cyclic garbage collector around bulk object creation.

Walking a big graph or decoding a million events creates millions of small,
acyclic objects; the collector then rescans every live object again and
again, which costs more than the work itself (2-3x measured on 1M events).
Nothing we build in those sections forms reference cycles that need it.

Only the entry points pause it (the CLI's command, an import, the server's
per-graph builds and state answers, a diff); the work below them does not.
Pauses nest and may overlap across threads: the collector runs again when the
last one ends (if it was running when the first began).

A short command's start is paused the same way (`start_paused` ... `start_done`:
`alloctrace record`, from its entry point until it has imported what it runs):
imports make modules, classes and functions that live until the process ends,
and the collector's passes over them cost such a command 2-3 ms.
"""
from __future__ import annotations

import functools
import gc
import threading
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False
_start_paused = False


def start_paused(was_enabled: bool | None = None) -> None:
    """Pause the collector for a command's start (see the module), if it runs; `was_enabled`: whether it ran
    when the caller paused it already itself (the entry point, before importing this module)."""
    global _start_paused
    if gc.isenabled() if was_enabled is None else was_enabled:
        gc.disable()
        _start_paused = True


def start_done() -> None:
    """End `start_paused`: what exists now (the imported modules, mostly) is frozen out of the collector's
    passes (gc.freeze), and the collector runs again. Nothing where the start was not paused."""
    global _start_paused
    if _start_paused:
        _start_paused = False
        gc.freeze()
        gc.enable()


@contextmanager
def gc_paused():
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()


def without_gc(fn):
    """Decorator form of gc_paused."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapper
