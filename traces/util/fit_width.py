"""Text tables that fit the terminal: the widest columns give way first, each long cell keeping its start and
its end (`llama-comp…gguf`), since names differ at both. Only for people: output read by a program (a pipe or
a file) keeps every character."""
from __future__ import annotations

import os
import re
import sys

ELLIPSIS = "…"
MIN_COLUMN = 8  # free text is squeezed to this many characters first (or its header's length, when longer)
MIN_ANY = 5  # then any column, down to this
NUMBER = re.compile(r"[-+]?[0-9][0-9,.]*|-")
GAP = 2  # spaces between columns (peak_types.text_table)
# free text gives way before the structured columns (ids, sizes, dates, generations)
FREE_TEXT = ("NAME", "TAGS", "TENSOR", "SITE", "CALL SITE", "FRAME", "PROGRAM", "OP", "FAMILY", "DESCRIPTION",
             "REASON", "WHY", "OOM", "GRAPHS", "CONFIG", "COMMAND", "POINT", "NOTE")


def terminal_width(stream=None) -> int | None:
    """The width to fit when `stream` (stdout) is a terminal: $COLUMNS when set, else the terminal's; None for
    a pipe or a file, whatever $COLUMNS says (a script reading the table gets every character)."""
    stream = stream or sys.stdout
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError, OSError):
        return None
    if os.environ.get("COLUMNS", "").isdecimal():
        return int(os.environ["COLUMNS"])
    try:  # as shutil.get_terminal_size (whose import, bz2 and lzma with it, costs a short command 1.5 ms)
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def middle_cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, its middle replaced by an ellipsis."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1 + 1) // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[len(text) - tail:] if tail else "")


def fit_rows(rows: list[list[str]], width: int | None) -> list[list[str]]:
    """`rows` (the first is the header) with the widest columns cut until a line fits in `width`."""
    if width is None or not rows:
        return rows
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    free = [str(h).strip().upper() in FREE_TEXT for h in rows[0]]
    # a column of numbers is never cut below its longest number (its heading may be)
    numeric = [all(NUMBER.fullmatch(str(r[i])) for r in rows[1:]) for i in range(len(widths))]
    least = [max([len(str(r[i])) for r in rows[1:]] or [0]) if numeric[i] else 0 for i in range(len(widths))]
    excess = sum(widths) + GAP * (len(widths) - 1) - width
    for only_free in (True, False):
        floor = [max(least[i], min(w, max(MIN_COLUMN, len(str(rows[0][i]))) if only_free else MIN_ANY))
                 for i, w in enumerate(widths)]
        while excess > 0:
            room = [i for i, (w, f) in enumerate(zip(widths, floor)) if w > f and (free[i] or not only_free)]
            if not room:
                break
            i = max(room, key=lambda k: (widths[k], k))
            widths[i] -= 1
            excess -= 1
    return [[middle_cut(str(c), w) for c, w in zip(r, widths)] for r in rows]
