"""A graph's memory map from the placements ggml made, where the model's own walk shows none.

An `alloc_graph` that reuses its plan prints nothing and walks nothing: ggml puts each tensor where the
plan says. The recording has those placements; this turns them into `alloc` / `free` events (reason
"recorded") at the real offsets, with lifetimes from graph order: a tensor is placed at the first node
that needs it and given back at the last node that reads it (views read their source), before that node's
own bytes are placed; outputs are kept. The plan's own walk (its reserve graph) has the allocator's exact order.
"""
from __future__ import annotations

from alloctrace.allocator.events import Event
from alloctrace.allocator.tallocr import pad


def _root(t):
    while t.view_src is not None:
        t = t.view_src
    return t


def placement_events(graph, call, by_ptr: dict, galloc, bufts: list, index: int) -> list[Event]:
    """Events for the call's own-tensor placements (`P` lines), in node order."""
    where: dict = {}  # model Tensor -> (offset, real buffer)
    for kind, tptr, buf, data, base in call.placements:
        t = by_ptr.get(tptr)
        if kind == "P" and t is not None and t.view_src is None:
            where[t] = (data - base, buf)
    if not where:
        return []
    to_model = {}  # real buffer -> (model buffer id, chunk), from tensors both placed
    for t, (_, buf) in where.items():
        if t in galloc.placement:
            to_model.setdefault(buf, (galloc.buffer_of[t], galloc.placement[t][0]))
    first: dict = {}
    last: dict = {}
    for k, node in enumerate(graph.nodes):
        for src in node.srcs:
            if src is not None:
                r = _root(src)
                first.setdefault(r, k)
                last[r] = k
        first.setdefault(_root(node), k)
    multi = len(bufts) > 1
    born_at: dict = {}  # tensor name of an event -> node where it was placed
    first_of = lambda e: born_at[e.tensor]  # noqa: E731
    opens: dict[int, list] = {}
    closes: dict[int, list] = {}
    for t, (off, buf) in where.items():
        if t not in first:
            continue
        bid, chunk = to_model.get(buf, (0, 0))
        size = pad(galloc.alloc_size(t, bid), bufts[bid].alignment)
        ev = dict(graph=index, tensor=t.name, op=t.op, size=size, offset=off, chunk=chunk,
                  buffer=bid if multi else None, reason="recorded")
        opens.setdefault(first[t], []).append(Event("alloc", node=first[t], **ev))
        born_at[t.name] = first[t]
        if not t.output:
            end = last.get(t, first[t])
            closes.setdefault(end, []).append(Event("free", node=end, **ev))
    out: list[Event] = []
    for k in range(len(graph.nodes)):  # a node's last reads end before its own bytes begin (an inplace
        # node takes its parent's offset); a tensor no later node reads ends right after it begins
        born = opens.get(k, [])
        ends = closes.get(k, [])
        out += [e for e in ends if first_of(e) < k] + born + [e for e in ends if first_of(e) == k]
    return out
