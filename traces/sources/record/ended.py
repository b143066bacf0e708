"""How a recorded program ended, in words: its exit status or signal, a time limit it ran past, and the last lines
it printed (bounded), instead of a guess. The static-link hint stays only where the executable itself carries
ggml's graph allocator (ggml linked into it, so no preloaded library sees its calls)."""
from __future__ import annotations

import os
import signal

TAIL_LINES = 5  # lines of the program's output a failure message quotes
TAIL_BYTES = 600  # and at most this many characters of them
SCAN_LIMIT = 256 << 20  # bytes of an executable read when looking for ggml's allocator inside it
GALLOCR = b"ggml_gallocr_alloc_graph"


def how(returncode: int, timed_out: float | None = None) -> str:
    """`returncode` as subprocess gives it (-N: killed by signal N), as what the program did: 'exited with status
    1', 'was killed by signal 9 (SIGKILL)', or 'timed out after 30 s' when it was killed for running past
    `timed_out` seconds."""
    if timed_out is not None:
        return f"timed out after {timed_out:g} s"
    if returncode < 0:
        try:
            name = f" ({signal.Signals(-returncode).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-returncode}{name}"
    return f"exited with status {returncode}"


def tail(text: str) -> str:
    """The last few non-empty lines of what the program printed, joined with ' | ', at most TAIL_BYTES long."""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    out = " | ".join(lines)
    return out if len(out) <= TAIL_BYTES else "..." + out[-TAIL_BYTES:]


def said(text: str) -> str:
    """'; it printed: ...' with the output's tail, or '; it printed nothing'."""
    t = tail(text)
    return f"; it printed: {t}" if t else "; it printed nothing"


def links_ggml_itself(path: str) -> bool:
    """Whether the executable file itself holds ggml's graph allocator (its symbol name is in the file): ggml
    linked into the program, where a preloaded library never sees its calls."""
    keep = len(GALLOCR) - 1
    try:
        with open(path, "rb") as f:
            prev, seen = b"", 0
            while seen < SCAN_LIMIT:
                chunk = f.read(1 << 20)
                if not chunk:
                    return False
                if GALLOCR in prev + chunk:
                    return True
                prev, seen = chunk[-keep:], seen + len(chunk)
    except OSError:
        return False
    return False


def nothing_recorded(prog: str, returncode: int, text: str | None, timed_out: float | None = None) -> str:
    """Why a run left no ggml allocator activity: how it ended and (when captured) what it printed; the
    static-link remedy only when the executable `prog` (its path) carries ggml's allocator itself."""
    path, prog = prog, os.path.basename(prog)
    ended = how(returncode, timed_out)
    out = said(text) if text is not None else " (its output is above)"
    if returncode == 0 and timed_out is None:
        why = f"no ggml allocator calls were seen: {prog} {ended} without using ggml's graph allocator"
        if links_ggml_itself(path):
            why += (" (ggml is linked into the executable itself, where a preloaded library cannot see it: build "
                    "it with shared libraries: -DBUILD_SHARED_LIBS=ON)")
        return why + out
    return f"{prog} {ended} before any ggml allocator call was seen{out}"
