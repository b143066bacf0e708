"""A point's total checked against the program's own memory breakdown, device by device and part by part.

llama.cpp ends with `| - Host | 34 = 0 + 3 + 29 |`: per device, self = model + context + compute in whole MiB,
each rounded down (context: the KV caches, output and recurrent state). Our parts: the weights, every KV cache,
output and recurrent state as printed (two decimals: ± 0.005 MiB each) and the compute buffers the recording
measured exactly. A part agrees when its range meets the printed [N, N + 1) MiB; where it does not, the check
says which part differs and by how much. Where a size was printed for all devices at once (a dry run's cache
`size` line with several buffer types), the devices' sums are checked instead (each row rounded down: [N, N +
devices) MiB). A CPU-only run's `projected to use N MiB of host memory` is checked as its Host total too.
"""
from __future__ import annotations

from .printed import MIB, SWA

HALF_CENT = 0.005  # a two-decimal figure's rounding, MiB
PARTS = {"model": ("weights",), "context": ("kv_cache", "output", "recurrent_state")}
HOST_HINTS = ("CPU", "Host")  # buffer types that live in host memory
SPANNING = ("total", "file")  # labels of a size printed for all devices at once (a dry run's cache `size` line)
ALL = "all devices"


def device_of(label: str, devices: list[str]) -> str | None:
    """The breakdown row a buffer type's size belongs to ("CUDA0 (SWA)" -> "CUDA0", "CPU_Mapped" -> "Host")."""
    name = label[:-len(SWA)] if label.endswith(SWA) else label
    if len(devices) == 1:
        return devices[0]
    if name in devices:
        return name
    if any(h in name for h in HOST_HINTS) and "Host" in devices:
        return "Host"
    return None


def parts_of(buffers: dict[str, int], printed: dict, devices: list[str]) -> tuple[dict, list[str]]:
    """{device: {part: [low, high] MiB}} of our figures, and the labels no row takes."""
    ours = {d: {"model": [0.0, 0.0], "context": [0.0, 0.0], "compute": [0.0, 0.0]} for d in devices}
    stray: list[str] = []

    def add(dev, part, lo, hi):
        ours[dev][part][0] += lo
        ours[dev][part][1] += hi

    for part, kinds in PARTS.items():
        for kind in kinds:
            for label, mib in (printed.get(kind) or {}).items():
                dev = device_of(label, devices)
                if dev is None:
                    stray.append(f"{kind} {label}")
                    continue
                whole = kind == "weights" and label in printed.get("breakdown_model", {}) and \
                    mib == printed["breakdown_model"][label]  # the breakdown's own whole MiB
                add(dev, part, *((mib, mib + 1) if whole else (mib - HALF_CENT, mib + HALF_CENT)))
    compute = buffers or {}
    exact = bool(compute)
    for label, size in (compute.items() if exact else (printed.get("compute") or {}).items()):
        dev = device_of(label, devices)
        if dev is None:
            stray.append(f"compute {label}")
            continue
        add(dev, "compute", *((size / MIB, size / MIB) if exact else (size - HALF_CENT, size + HALF_CENT)))
    return ours, stray


def check(buffers: dict[str, int], printed: dict) -> dict | None:
    """Our total against the program's breakdown, or None where it printed none. {"agrees", "devices": [{device,
    printed: {self, model, context, compute}, ours: {part: [low, high]}, differs: [{part, printed, ours,
    short_by | over_by}]}], "stray": labels no device row takes}."""
    rows = {k[len("breakdown_"):]: v for k, v in printed.items() if k.startswith("breakdown_")}
    devices = list(rows.get("self") or {})
    if not devices:
        return None
    width = 1  # the printed figures are whole MiB rounded down: the truth is in [N, N + width)
    if len(devices) > 1 and spans_devices(printed):  # a size for all devices at once: check the sums
        rows = {part: {ALL: sum(v.values())} for part, v in rows.items()}
        width, devices = len(devices), [ALL]
    ours, stray = parts_of(buffers, printed, devices)
    out = []
    for dev in devices:
        mine = ours[dev]
        mine["self"] = [sum(mine[p][0] for p in ("model", "context", "compute")),
                        sum(mine[p][1] for p in ("model", "context", "compute"))]
        shown = {p: rows[p][dev] for p in ("self", "model", "context", "compute")}
        parts = ["model", "context", "compute", "self"]
        projected = (printed.get("projected") or {}).get("host")
        if projected is not None and devices == ["Host"]:  # a CPU-only run's fitting pass: `projected to use`
            shown["projected"], mine["projected"] = projected, mine["self"]
            parts.append("projected")
        differs = []
        for part in parts:
            lo, hi = (max(0.0, x) for x in mine[part])
            n = shown[part]
            if hi < n:
                differs.append({"part": part, "printed": n, "ours": [lo, hi], "short_by": [n - hi, n + width - lo]})
            elif lo >= n + width:
                differs.append({"part": part, "printed": n, "ours": [lo, hi], "over_by": [lo - n - width, hi - n]})
        out.append({"device": dev, "rows": width, "printed": shown,
                    "ours": {p: [round(x, 4) for x in v] for p, v in mine.items()}, "differs": differs})
    return {"agrees": not stray and all(not d["differs"] for d in out), "devices": out, "stray": stray}


def spans_devices(printed: dict) -> bool:
    """Some size was printed for all devices at once: the per-device rows cannot be told apart for it."""
    return any((label[:-len(SWA)] if label.endswith(SWA) else label) in SPANNING
               for kind in ("weights", "kv_cache", "output", "recurrent_state") for label in printed.get(kind) or {})


def check_lines(c: dict | None, indent: str = "  ") -> list[str]:
    """One line per device: agrees, or which part differs and by how much."""
    if c is None:
        return [f"{indent}the program printed no memory breakdown to check against (llama.cpp prints it with -v)"]
    lines = []
    for d in c["devices"]:
        pr, mine, rows = d["printed"], d["ours"], d.get("rows", 1)
        rounding = "rounded down" if rows == 1 else f"{rows} rows summed, each rounded down"
        head = (f"{indent}{d['device']}: the program's breakdown {pr['self']:.0f} = {pr['model']:.0f} + "
                f"{pr['context']:.0f} + {pr['compute']:.0f} MiB (model + context + compute, {rounding}); "
                f"ours {_range(mine['self'])} MiB")
        if not d["differs"]:
            lines.append(head + ": agrees")
            continue
        lines.append(head + ": DIFFERS")
        for x in d["differs"]:
            how = f"short by {_range(x['short_by'])}" if "short_by" in x else f"over by {_range(x['over_by'])}"
            lines.append(f"{indent}  {x['part']}: ours {_range(x['ours'])} MiB, printed {x['printed']:.0f} MiB: "
                         f"{how} MiB")
    for s in c["stray"]:
        lines.append(f"{indent}  {s}: no row of the breakdown names its device")
    return lines


def _range(v) -> str:
    lo, hi = f"{v[0]:.2f}", f"{v[1]:.2f}"
    return lo if lo == hi else f"{lo} to {hi}"
