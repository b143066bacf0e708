"""A memory flamegraph: the bytes live at one entry (the peak by default) by stack, as a tree.

Each live allocation adds its requested bytes along its stack, outermost frame first. The frames kept are
the Python frames outside `skip` (torch's own files by default), so the leaves are the call sites of the
peak view and their bytes add up the same; a stack with no such frame (the autograd thread, C++ only) is one
node named as the peak view names it. Bytes that were live before the trace began are one node of their own,
so the root is exactly the requested bytes live at the entry. Nodes under `min_share` of the root are
merged into one "(N smaller)" node per parent, which bounds the tree whatever the snapshot's size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from alloctrace.traces.errors import UserError

from alloctrace.traces.store.torch_stored import OOM
from alloctrace.traces.state.torch_frames import DEFAULT_SKIP, is_python, short
from alloctrace.traces.state.torch_device import PREEXISTING, Device, live_at
from alloctrace.traces.state.torch_wrapped import note as partial_note

MAX_DEPTH = 64


@dataclass
class Node:
    name: str
    value: int = 0
    count: int = 0
    children: dict = field(default_factory=dict)

    def child(self, name: str) -> "Node":
        n = self.children.get(name)
        if n is None:
            n = self.children[name] = Node(name)
        return n

    def to_dict(self) -> dict:
        kids = sorted(self.children.values(), key=lambda n: (-n.value, n.name))
        return {"name": self.name, "value": self.value, "count": self.count,
                "children": [k.to_dict() for k in kids]}


def resolve_entry(dev: Device, at: str | int | None) -> int:
    """An entry index from `--at`: a number, `peak` (default: the requested-bytes peak), `oom` (the first OOM),
    or `end` (the snapshot)."""
    if at is None or at == "peak":
        return int(np.argmax(dev.curves()[0])) if dev.n else 0
    if at == "end":
        return max(dev.n - 1, 0)
    if at == "oom":
        ooms = np.flatnonzero(dev.cols["action"] == OOM)
        if not len(ooms):
            raise UserError(f"device {dev.device} of trace {dev.trace_id} has no OOM")
        return int(ooms[0])
    try:
        k = int(at)
    except (TypeError, ValueError):
        raise UserError(f"--at: expected an entry number, peak, oom or end, not {str(at)[:40]!r}") from None
    if not 0 <= k < max(dev.n, 1):
        raise UserError(f"entry {k} is out of range (0..{max(dev.n - 1, 0)})")
    return k


def stack_path(dev: Device, stack: int, start: int, skip=DEFAULT_SKIP) -> list[str]:
    """The kept frames of a stack, outermost first (see the module's docstring)."""
    key = ("flame_path", stack, tuple(skip))
    path = dev._cache.get(key)
    if path is None:
        kept = [f for f in dev.frames(stack) if is_python(f) and not any(p in f["filename"] for p in skip)]
        path = [f"{f['name']} ({short(f['filename'])}:{f['line']})" for f in reversed(kept)][-MAX_DEPTH:]
        if stack >= 0 or path:
            dev._cache[key] = path
    return path or [dev.label(stack, start, skip)]


def flame(dev: Device, at: str | int | None = None, skip=DEFAULT_SKIP, min_share: float = 0.001) -> dict:
    """The tree at entry `at` as nested dicts {name, value, count, children}, with the entry and its totals."""
    k = resolve_entry(dev, at)
    al = dev.allocations()
    rows = live_at(dev, k) if dev.n else np.zeros(0, dtype=np.int64)
    root = Node("all")
    by_stack: dict[tuple[int, str], list[int]] = {}
    for stack, start, size in zip(al.stack[rows].tolist(), al.start[rows].tolist(), al.size[rows].tolist()):
        path = tuple(stack_path(dev, stack, start, skip))
        g = by_stack.setdefault(path, [0, 0])
        g[0] += size
        g[1] += 1
    for path, (b, c) in by_stack.items():
        node = root
        node.value += b
        node.count += c
        for name in path:
            node = node.child(name)
            node.value += b
            node.count += c
    live = int(dev.curves()[0][k]) if dev.n else 0
    if live > root.value:  # live bytes the trace never saw allocated (it wrapped or began late)
        pre = root.child(PREEXISTING)
        pre.value = live - root.value
        root.value = live
    _prune(root, max(1, int(root.value * min_share)))
    out = {"trace_id": dev.trace_id, "device": dev.device, "name": dev.name, "event": k, "n_events": dev.n,
            "time_us": int(dev.cols["time_us"][k]) if dev.n else None, "bytes": root.value,
            "live_allocations": int(len(rows)), "min_share": min_share, "tree": root.to_dict()}
    line = partial_note(dev.extra)
    if line:  # a trace that wrapped says so in every answer
        out["partial"] = line
    return out


def _prune(node: Node, floor: int):
    small = [n for n in node.children.values() if n.value < floor]
    if len(small) > 1:
        for n in small:
            del node.children[n.name]
        rest = node.child(f"({len(small)} smaller)")
        rest.value, rest.count = sum(n.value for n in small), sum(n.count for n in small)
    for n in node.children.values():
        _prune(n, floor)


def folded(tree: dict) -> list[str]:
    """The tree as folded stacks (`frame;frame;frame BYTES`, one line per leaf), as flamegraph tools read."""
    out: list[str] = []

    def walk(node, prefix):
        own = node["value"] - sum(c["value"] for c in node["children"])
        path = prefix + [node["name"].replace(";", ",")]
        if own > 0 and prefix:
            out.append(f"{';'.join(path[1:])} {own}")
        for c in node["children"]:
            walk(c, path)
    walk(tree, [])
    return out
