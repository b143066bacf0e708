"""The one way sizes are written for people: bytes with a binary prefix and two decimals.

Every face that prints a size (check, explain, peak, sweep, what-if) writes it with `fmt_bytes`, so the same
number reads the same everywhere: 1536 -> "1.50 KiB", 1610612736 -> "1.50 GiB", 512 -> "512 B".
"""
from __future__ import annotations

UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: int | None) -> str:
    """Bytes with a binary prefix: 1536 -> '1.50 KiB'; None -> '-'."""
    if n is None:
        return "-"
    v, unit = float(abs(n)), "B"
    for u in UNITS:
        if v < 1024:
            break
        v, unit = v / 1024, u
    s = f"{int(v)} B" if unit == "B" else f"{v:.2f} {unit}"
    return ("-" if n < 0 else "") + s
