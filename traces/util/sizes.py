"""The one way sizes are written for people (bytes with a binary prefix and two decimals), and read from them.

Every face that prints a size (check, explain, peak, sweep, what-if) writes it with `fmt_bytes`, so the same
number reads the same everywhere: 1536 -> "1.50 KiB", 1610612736 -> "1.50 GiB", 512 -> "512 B".
"""
from __future__ import annotations

import re

UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: int | None) -> str:
    """Bytes with a binary prefix and two decimals, half-up: 1536 -> '1.50 KiB', 1152 -> '1.13 KiB', 512 ->
    '512 B'; None -> '-'. The dashboard's `fmtBytes` (web/common.js) writes the same strings (tests/util/test_sizes.py
    runs both on one table), so the rounding is done on integers, as JavaScript's toFixed rounds the exact value."""
    if n is None:
        return "-"
    n = int(n)
    a, k = abs(n), 0
    if a < 1024:
        return f"{n} B"
    while k < len(UNITS) and a >= 1024 ** (k + 1):
        k += 1
    d = 1024 ** k
    hundredths = (a * 200 + d) // (2 * d)
    return f"{'-' if n < 0 else ''}{hundredths // 100}.{hundredths % 100:02d} {UNITS[k - 1]}"


# K, M, G, T alone and KiB ... TiB are powers of 1024 (as `docker --memory 6g`, `java -Xmx6g` and llama.cpp's
# MiB mean them); KB, MB, GB, TB are powers of 1000, as the SI writes them.
PARSE_UNITS = {"": 1, "b": 1,
               "k": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3,
               "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
               "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
               "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12}
MAX_SIZE = 1 << 60
SIZE_EXAMPLES = "e.g. 6GiB, 512M, 1.5GB or a number of bytes"


def parse_size(text: str) -> int:
    """'6GiB' and '6G' -> 6442450944, '1.5 GB' -> 1500000000, '4096' -> 4096; ValueError (saying what is
    wanted) for anything else, for 0 and for more than 2**60."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-z]*)", str(text).strip().lower().replace("_", "").replace(" ", ""))
    if not m or m.group(2) not in PARSE_UNITS:
        raise ValueError(f"not a size: {text!r} ({SIZE_EXAMPLES})")
    n = int(float(m.group(1)) * PARSE_UNITS[m.group(2)])
    if n <= 0 or n > MAX_SIZE:
        raise ValueError(f"size out of range: {text!r} (more than 0 bytes, at most 2**60)")
    return n
