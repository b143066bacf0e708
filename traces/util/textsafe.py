"""Text for a terminal: names from traces are data, never terminal commands.

A trace name or tensor name may hold escape sequences (an OSC title change, a
cursor move) or a line break that forges a table row. Every human-readable
line the CLI prints goes through `safe`, which shows such characters as
visible escapes (`\\x1b`, `\\n`) instead of sending them to the terminal.
"""
from __future__ import annotations

import re

# C0 and C1 controls, DEL, line/paragraph separators and the bidirectional overrides; compiled when first
# needed (it costs a short command 0.6 ms): printable ASCII, the usual text, holds none of them
CONTROL = "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
_compiled: list = []
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def control_re() -> re.Pattern:
    if not _compiled:
        _compiled.append(re.compile(CONTROL))
    return _compiled[0]


def safe(text) -> str:
    """`text` as one printable line: control characters become visible escapes."""
    s = str(text)
    if s.isascii() and s.isprintable():  # 0x20-0x7e only: nothing to escape
        return s
    control = control_re()
    return control.sub(_escape, s) if control.search(s) else s


def safe_lines(lines) -> str:
    """Lines joined for printing, each made safe (a line break inside one cannot forge another)."""
    return "\n".join(safe(line) for line in lines)


def text_table(rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns, one string per row (here, not with the peak's types: a listing that
    prints one imports nothing else)."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
