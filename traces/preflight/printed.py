"""The sizes a program prints about itself, beside the compute buffer the recording measures exactly.

llama.cpp prints them in MiB (two decimals; the memory breakdown in whole MiB): weights (`model buffer size`,
or with `no_alloc`, as `llama-fit-params` runs, the breakdown's `model` column), KV cache (`llama_kv_cache:
size`), output and compute buffers. Printed figures are rounded, so they are kept as printed (MiB) and
never mixed into the exact bytes; `bytes_of` gives the nearest byte count for a total.
"""
from __future__ import annotations

import re

MIB = 1 << 20
MAX_SCAN = 1 << 24  # bytes of output read: a chatty program's tail is never needed

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
BUFFER = re.compile(r"(\S+)\s+(model|KV|output|compute|RS) buffer size =\s*" + _NUM + r" MiB")
KV_SIZE = re.compile(r"llama_kv_cache: size =\s*" + _NUM + r" MiB")
FILE_SIZE = re.compile(r"file size\s*=\s*" + _NUM + r" (MiB|GiB)")
# | - Host | 19 = 6 + 1 + 12 |    and    | - CUDA0 (...) | 24000 = 100 + (900 = 800 + 50 + 50) + 2 |
BREAKDOWN = re.compile(r"\|\s+-\s+(.+?)\s+\|[^|]*?(?:\(\s*)?(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\)?")
KIND = {"model": "weights", "KV": "kv_cache", "output": "output", "compute": "compute", "RS": "recurrent_state"}


def printed_sizes(text: str) -> dict:
    """{"weights": {device: MiB}, "kv_cache": {...}, "compute": {...}, ...} from a program's output;
    only what it printed. Later lines win (llama.cpp prints its fitting pass first)."""
    # only lines that can hold a size: the regular expressions then scan kilobytes, not a chatty log
    text = "\n".join(line for line in text[-MAX_SCAN:].splitlines() if "MiB" in line or "=" in line and "|" in line)
    out: dict[str, dict[str, float]] = {}
    breakdown: dict[str, tuple[float, float, float]] = {}
    for m in BREAKDOWN.finditer(text):
        breakdown[m.group(1).split(" (")[0]] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
    for m in BUFFER.finditer(text):
        out.setdefault(KIND[m.group(2)], {})[m.group(1)] = float(m.group(3))
    kv = KV_SIZE.findall(text)
    if kv and not any(out.get("kv_cache", {}).values()):  # a no_alloc context prints 0.00 for its buffers
        out["kv_cache"] = {"total": float(kv[-1])}
    if breakdown and not any(out.get("weights", {}).values()):
        out["weights"] = {dev: w for dev, (w, _c, _k) in breakdown.items()}
    if not out.get("weights"):
        f = FILE_SIZE.findall(text)
        if f:
            v, unit = f[-1]
            out["weights"] = {"file": float(v) * (1024 if unit == "GiB" else 1)}
    for kind in list(out):
        if kind != "compute" and not any(out[kind].values()):
            del out[kind]  # all zero: a weightless dry run's empty buffers say nothing
    return out


def total_mib(printed: dict, kinds=("weights", "kv_cache", "output", "recurrent_state")) -> float:
    return sum(sum(printed.get(k, {}).values()) for k in kinds)


def bytes_of(mib: float) -> int:
    return int(round(mib * MIB))
