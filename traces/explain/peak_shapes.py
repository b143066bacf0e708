"""What a peak's tensors are: shape and type (ne, type) and how their bytes follow from them, and a name a
user can map back to the model for tensors the program left unnamed (`SCALE(kq-0)`: the op and its inputs).

A recording keeps each graph's shapes in its extra (`shapes`: name -> [type, ne, op, input names]); other
sources have none, and their peaks stay as they were.
"""
from __future__ import annotations

import re

from alloctrace.traces.explain.peak_types import display_name

# bytes per element of ggml's plain types; block types as (bytes per block, elements per block)
TYPE_SIZE = {"f32": (4, 1), "f16": (2, 1), "bf16": (2, 1), "f64": (8, 1), "i8": (1, 1), "i16": (2, 1),
             "i32": (4, 1), "i64": (8, 1), "q4_0": (18, 32), "q4_1": (20, 32), "q5_0": (22, 32), "q5_1": (24, 32),
             "q8_0": (34, 32), "q8_1": (36, 32), "q2_K": (84, 256), "q3_K": (110, 256), "q4_K": (144, 256),
             "q5_K": (176, 256), "q6_K": (210, 256), "q8_K": (292, 256)}
UNNAMED = re.compile(r"^(?:node|leaf)_\d+$")
MAX_LABEL = 120


def is_unnamed(name: str | None) -> bool:
    return not name or bool(UNNAMED.match(name))


def label(name: str, shapes: dict, depth: int = 2) -> str:
    """The tensor's own name, or for an unnamed one its op over its inputs' labels: `SCALE(kq-0)`."""
    s = shapes.get(name)
    if not is_unnamed(name) or s is None:
        return name
    op, srcs = s[2], s[3]
    inner = ", ".join(label(x, shapes, depth - 1) if depth > 1 else (x or "?") for x in srcs)
    text = f"{op}({inner})"
    return text if len(text) <= MAX_LABEL else text[:MAX_LABEL - 4] + "...)"


def ne_text(ne) -> str:
    dims = list(ne)
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return "[" + ", ".join(str(d) for d in dims) + "]"


def shape_of(name: str, shapes: dict, alloc_bytes: int | None = None) -> dict | None:
    """{"type", "ne", "bytes", "formula"} for a tensor: its nbytes from ne and type, and the allocator's
    padding beyond that when `alloc_bytes` (what the allocator counted) is larger."""
    s = shapes.get(name)
    if s is None:
        return None
    type_, ne = s[0], list(s[1])
    out = {"type": type_, "ne": ne, "op": s[2], "inputs": s[3]}
    size = TYPE_SIZE.get(type_)
    if size is None:
        return out
    per_block, block = size
    n = 1
    for d in ne:
        n *= d
    nbytes = n * per_block // block
    dims = [str(d) for d in ne_text(ne)[1:-1].split(", ")]
    factor = str(per_block) if block == 1 else f"{per_block}/{block}"
    out["bytes"] = nbytes
    out["formula"] = f"{type_} {ne_text(ne)}: {'·'.join([factor, *dims])} = {nbytes:,} B"
    if alloc_bytes is not None and alloc_bytes > nbytes:
        out["formula"] += f" (+{alloc_bytes - nbytes:,} B padding)"
    return out


def own_shape(t: dict, shapes: dict) -> dict | None:
    """The shape of one listed tensor, where the recording's shapes (kept by name) are surely its own: its
    name is the only one of its plan (`occurrence` None) and its bytes are at least what ne and type need.
    Two tensors named alike never lend each other a shape, nor the difference between them as padding."""
    if t.get("occurrence") is not None:
        return None
    s = shape_of(t["tensor"], shapes, t["bytes"])
    if s is None or s.get("bytes", 0) > t["bytes"]:
        return None
    return s


def _label(name: str, occurrence, shapes: dict) -> str:
    return label(name, shapes) if occurrence is None else display_name(name, occurrence)


def annotate(out: dict, shapes: dict) -> dict:
    """A peak's JSON with labels for unnamed tensors, each family's largest tensor's shape, and the padding
    the allocator added to the tensors whose own shapes are known."""
    if not shapes:
        return out
    largest: dict[str, dict] = {}
    padding = known = 0
    for t in out.get("tensors") or ():
        t["label"] = _label(t["tensor"], t.get("occurrence"), shapes)
        if t["family"] not in largest:  # tensors are listed largest first
            largest[t["family"]] = t
        s = own_shape(t, shapes)
        if s is not None and "bytes" in s:
            padding += t["bytes"] - s["bytes"]
            known += 1
    if out.get("accounting") and out.get("tensors") is not None:
        out["accounting"]["padding_bytes"], out["accounting"]["padding_known_for"] = padding, known
    parts = [out, *(out.get("buffers") or ())]
    for part in parts:
        for f in part.get("families") or ():
            t = largest.get(f["family"])
            f["shape"] = own_shape(t, shapes) if t else None
            for key in ("first_node", "last_node"):
                if f.get(key):
                    f[key] = label(f[key], shapes)  # a shared name arrives as `NAME #k`: no shape has it
        pk = part.get("peak") or {}
        if pk.get("tensor"):
            pk["label"] = label(pk["tensor"], shapes)
        for h in (part.get("fragmentation") or {}).get("holes") or ():
            for x in h["freed"]:
                x["label"] = _label(x["tensor"], x.get("occurrence"), shapes)
    return out
