"""The sizes a program prints about itself, beside the compute buffer the recording measures exactly.

llama.cpp prints them in MiB (two decimals; the memory breakdown in whole MiB, rounded down): weights
(`model buffer size`, or with `no_alloc`, as `llama-fit-params` runs, `file size`), each KV cache (a
`KV buffer size` line per buffer type, then `llama_kv_cache: size`), output and compute buffers, and at the end
the breakdown per device (`| - Host | 19 = 6 + 1 + 12 |`: self = model + context + compute) and the `projected
to use` line. A sliding-window (iSWA) model has two KV caches, announced by `creating non-SWA KV cache` and
`creating SWA KV cache`; a hybrid model's recurrent state (`RS buffer size`, `llama_memory_recurrent: size`) is
read the same way; each keeps its own label ("CPU", "CPU (SWA)"), so the shape stays {kind: {label: MiB}}
and every cache counts. Printed figures are rounded, so they are kept as printed (MiB) and never mixed into the
exact bytes; `bytes_of` gives the nearest byte count for a total.
"""
from __future__ import annotations

import re

MIB = 1 << 20
MAX_SCAN = 1 << 24  # bytes of output read: a chatty program's tail is never needed
SWA = " (SWA)"  # the label suffix of a sliding-window cache's sizes

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
BUFFER = re.compile(r"(\S+)\s+(model|KV|output|compute|RS) buffer size =\s*" + _NUM + r" MiB")
STATE_SIZE = re.compile(r"llama_(kv_cache|memory_recurrent): size =\s*" + _NUM + r" MiB")
KV_CACHE = re.compile(r"creating\s+(non-SWA|SWA) KV cache")
FILE_SIZE = re.compile(r"file size\s*=\s*" + _NUM + r" (MiB|GiB)")
# | - Host | 19 = 6 + 1 + 12 |    and    | - CUDA0 (...) | 24000 = 100 + (900 = 800 + 50 + 50) + 2 |
BREAKDOWN = re.compile(r"\|\s+-\s+(.+?)\s+\|[^|]*?(?:\(\s*)?(\d+)\s*=\s*(\d+)\s*\+\s*(\d+)\s*\+\s*(\d+)\s*\)?")
PROJECTED = re.compile(r"projected to use (\d+) MiB of (.+?) memory")
KIND = {"model": "weights", "KV": "kv_cache", "output": "output", "compute": "compute", "RS": "recurrent_state"}
# the breakdown's columns, whole MiB rounded down, by device: kind "breakdown_self" is {"Host": 19}
BREAKDOWN_KINDS = ("breakdown_self", "breakdown_model", "breakdown_context", "breakdown_compute")
MEMORY_KINDS = ("weights", "kv_cache", "output", "recurrent_state")  # what the budget counts besides compute


def _lines(text: str) -> list[str]:
    """Only lines that can hold a size: the regular expressions then scan kilobytes, not a chatty log."""
    return [line for line in text[-MAX_SCAN:].splitlines()
            if "MiB" in line or "=" in line and "|" in line or "KV cache" in line]


def printed_sizes(text: str) -> dict:
    """{"weights": {device: MiB}, "kv_cache": {label: MiB}, "compute": {...}, "breakdown_self": {...}, ...}
    from a program's output; only what it printed. Later lines win (llama.cpp prints its fitting pass first);
    the KV caches are those of the last context made."""
    out: dict[str, dict[str, float]] = {}
    # the last context's caches (KV) and recurrent states (RS): {"swa", "buffers": {buft: MiB}, "size": MiB | None}
    groups: dict[str, list[dict]] = {"KV": [], "RS": []}
    file_size = None

    def current(kind: str) -> dict:
        if not groups[kind] or groups[kind][-1]["size"] is not None:  # one per context (a plain model's cache)
            groups[kind] = [{"swa": False, "buffers": {}, "size": None}]
        return groups[kind][-1]

    for line in _lines(text):
        m = KV_CACHE.search(line)
        if m:
            swa = m.group(1) == "SWA"
            if not swa:
                groups["KV"] = []  # a new context's first cache
            groups["KV"].append({"swa": swa, "buffers": {}, "size": None})
            continue
        m = BUFFER.search(line)
        if m and m.group(2) in groups:
            current(m.group(2))["buffers"][m.group(1)] = float(m.group(3))
            continue
        if m:
            out.setdefault(KIND[m.group(2)], {})[m.group(1)] = float(m.group(3))
            continue
        m = STATE_SIZE.search(line)
        if m:
            current("KV" if m.group(1) == "kv_cache" else "RS")["size"] = float(m.group(2))
            continue
        m = BREAKDOWN.search(line)
        if m:
            dev = m.group(1).split(" (")[0]
            for kind, v in zip(BREAKDOWN_KINDS, m.group(2, 3, 4, 5)):
                out.setdefault(kind, {})[dev] = float(v)
            continue
        m = PROJECTED.search(line)
        if m:
            out.setdefault("projected", {})[m.group(2)] = float(m.group(1))
            continue
        m = FILE_SIZE.search(line)
        if m:
            file_size = float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)
    for kind, found in groups.items():
        if found:
            out[KIND[kind]] = kv_labels(found)
    if not any(out.get("weights", {}).values()):  # a weightless dry run prints 0.00 for its model buffers
        out["weights"] = dry_run_weights(out, file_size)
    for kind in [k for k in out if k in MEMORY_KINDS]:
        out[kind] = {label: v for label, v in out[kind].items() if v}  # a dry run's 0.00 beside the real run's
        if not out[kind]:
            del out[kind]  # all zero: a weightless dry run's empty buffers say nothing
    return out


def kv_labels(caches: list[dict]) -> dict[str, float]:
    """Each cache's (or recurrent state's) sizes by label: its buffers where they hold bytes, else its `size`
    line, labelled with its one buffer type (or "total" when it has several or none); a sliding-window cache's
    labels end in " (SWA)"."""
    out: dict[str, float] = {}
    for c in caches:
        suffix = SWA if c["swa"] else ""
        if any(c["buffers"].values()):
            for buft, mib in c["buffers"].items():
                out[buft + suffix] = out.get(buft + suffix, 0.0) + mib
        elif c["size"] is not None:
            label = next(iter(c["buffers"])) if len(c["buffers"]) == 1 else "total"
            out[label + suffix] = out.get(label + suffix, 0.0) + c["size"]
    return out


def dry_run_weights(out: dict, file_size: float | None) -> dict[str, float]:
    """A weightless dry run's weights: the printed file size (two decimals: the tensors' bytes) where one
    device holds them all, else the breakdown's model column (whole MiB, rounded down) by device."""
    model = out.get("breakdown_model", {})
    if file_size is not None and len(model) <= 1:
        return {next(iter(model), "file"): file_size}
    return dict(model)


def total_mib(printed: dict, kinds=MEMORY_KINDS) -> float:
    return sum(sum(printed.get(k, {}).values()) for k in kinds)


def bytes_of(mib: float) -> int:
    return int(round(mib * MIB))
