"""An allocation plan: where every tensor of a graph lives in the compute buffer, and in what order nodes run.

The allocator model answers "does it fit"; a Plan is what the hazard checker
and the numeric executor need to answer "is it safe": byte ranges (views
included, external tensors outside the buffer as None) and the execution
steps, serial or parse_seq levels that Metal dispatched concurrently.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from alloctrace.allocator import LAYOUTS, Gallocr, LegacyAllocator, get_profile
from alloctrace.allocator.harness import graph_from_json
from alloctrace.allocator.tensor import Graph, Tensor, nbytes_of

PURE_VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})


# --- memory aliasing, independent of any allocator ------------------------------------------
def extent(t: Tensor) -> int:
    """Bytes a tensor touches, from its first element to the end of its last.

    2023 ggml counted a view as ne[3]*nb[3], which runs past a strided view's last
    element into the neighbour's bytes; ranges must not, so this is recomputed.
    """
    return nbytes_of(t.type, t.ne, t.nb)


def alias_parent(t: Tensor):
    """(tensor whose memory t uses, byte offset into it), or None when t has its own memory."""
    if t.view_src is not None:  # ggml's own answer, already the root
        return t.view_src, t.view_offs
    if t.op == "CPY" and len(t.srcs) > 1 and t.srcs[1] is not None:
        return t.srcs[1], 0  # CPY writes into its destination and is a view of it
    if t.op in PURE_VIEW_OPS and t.srcs and t.srcs[0] is not None:
        return t.srcs[0], (t.op_offset if t.op == "VIEW" else 0)
    return None


def root_of(t: Tensor) -> tuple[Tensor, int]:
    """The tensor that owns t's memory (t itself unless t is a view) and t's byte offset in it."""
    offset = 0
    while True:
        up = alias_parent(t)
        if up is None:
            return t, offset
        t, offs = up
        offset += offs


def writes(t: Tensor) -> bool:
    """Views and leafs compute nothing; every other node writes its own bytes (CPY: its destination)."""
    return t.op != "NONE" and t.op not in PURE_VIEW_OPS


def read_srcs(t: Tensor) -> list[Tensor]:
    """The sources whose contents a node reads: all but a CPY's destination; views read nothing."""
    if not writes(t):
        return []
    srcs = [s for s in t.srcs if s is not None]
    if t.op == "CPY" and len(t.srcs) > 1:
        srcs = [s for s in srcs if s is not t.srcs[1]]
    return srcs


def graph_outputs(graph: Graph) -> list[Tensor]:
    """Tensors whose values the program reads after compute: flagged outputs and the last node."""
    outs = [t for t in graph.nodes if t.output]
    if graph.nodes and graph.nodes[-1] not in outs:
        outs.append(graph.nodes[-1])
    return outs


def input_roots(graph: Graph) -> list[Tensor]:
    """Leafs the program fills before compute: read by some node (maybe through views), written by none."""
    written = {root_of(n)[0] for n in graph.nodes if writes(n)}
    seen, out = set(), []
    for node in graph.nodes:
        for s in read_srcs(node):
            root = root_of(s)[0]
            if root.op == "NONE" and root not in written and root not in seen:
                seen.add(root)
                out.append(root)
    return out


def levels_from_parse_seq(parse_seq, n_nodes: int) -> list[list[int]]:
    """Split a Metal parse_seq at its -1 barriers; entries after the last barrier form a final level."""
    levels, cur, seen = [], [], set()
    for i in parse_seq:
        if i == -1:
            if cur:
                levels.append(cur)
            cur = []
            continue
        if not 0 <= i < n_nodes:
            raise ValueError(f"parse_seq names node {i}, but the graph has {n_nodes} nodes")
        if i in seen:
            raise ValueError(f"parse_seq names node {i} twice")
        seen.add(i)
        cur.append(i)
    if cur:
        levels.append(cur)
    missing = n_nodes - len(seen)
    if missing:
        raise ValueError(f"parse_seq leaves {missing} of {n_nodes} nodes out")
    return levels


# --- the plan ----------------------------------------------------------------------------------
@dataclass
class Plan:
    graph: Graph
    ranges: dict  # Tensor -> (start, end) bytes from the buffer start, or None (lives outside the buffer)
    levels: list  # lists of node indices; serial plans have one node per level
    concurrent: bool  # nodes of a level run at the same time (Metal with parse_seq)
    buffer_size: int
    profile: str = ""
    graph_index: int = 0
    unallocated: list = field(default_factory=list)  # tensors the allocator left without memory
    note: str = ""
    params: dict = field(default_factory=dict)  # node name -> scalar op params (n_past, eps, ...)

    def range(self, t: Tensor):
        return self.ranges.get(t)

    def steps(self) -> list[list[int]]:
        """What runs at once: the levels when concurrent, else one node per step in level order."""
        if self.concurrent:
            return [list(level) for level in self.levels]
        return [[i] for level in self.levels for i in level]

    def moved(self, t: Tensor, new_offset: int) -> "Plan":
        """A copy where t's memory (and every view of it) starts at new_offset: a broken plan for tests."""
        root, _ = root_of(t)
        if self.ranges.get(root) is None:
            raise ValueError(f"{root.name} has no bytes in the buffer to move")
        delta = new_offset - self.ranges[root][0]
        ranges = dict(self.ranges)
        for u, r in self.ranges.items():
            if r is not None and root_of(u)[0] is root:
                ranges[u] = (r[0] + delta, r[1] + delta)
        return replace(self, ranges=ranges, buffer_size=max(self.buffer_size, ranges[root][1]),
                       note=(self.note + "; " if self.note else "") + f"{root.name} moved to {new_offset}")


def _serial_levels(graph: Graph, parse_seq):
    if parse_seq:
        return levels_from_parse_seq(parse_seq, graph.n_nodes)
    return [[i] for i in range(graph.n_nodes)]


def plan_from_legacy(graph: Graph, alloc: LegacyAllocator, parse_seq=None, concurrent: bool | None = None,
                     graph_index: int = 0) -> Plan:
    """A plan from a 2023 allocator after alloc_graph: addresses inside its buffer become offsets."""
    tal = alloc.t
    ranges, unallocated, end = {}, [], 0
    for t in graph.tensors():
        a = alloc.addr(t)
        if a == 0:
            if t.op != "NONE":
                unallocated.append(t)
            ranges[t] = None
        elif tal.inside(a):
            start = a - tal.base
            ranges[t] = (start, start + extent(t))
            end = max(end, start + extent(t))
        else:
            ranges[t] = None
    size = max(end, tal.max_size) if tal.measure else tal.size
    return Plan(graph, ranges, _serial_levels(graph, parse_seq),
                concurrent=bool(parse_seq) if concurrent is None else concurrent, buffer_size=size,
                profile=alloc.profile.name, graph_index=graph_index, unallocated=unallocated)


def plan_from_gallocr(graph: Graph, galloc: Gallocr, graph_index: int = 0) -> Plan:
    """A plan from ggml-head's gallocr: chunks are laid end to end as one buffer."""
    sizes = galloc.chunk_sizes or [0]
    bases = [sum(sizes[:c]) for c in range(len(sizes))]
    ranges, unallocated = {}, []
    for t in graph.tensors():
        place = galloc.placement.get(t)
        if place is not None:
            start = bases[place[0]] + place[1]
            ranges[t] = (start, start + extent(t))
        else:
            ranges[t] = None
            if not t.data and t.op != "NONE":
                unallocated.append(t)
    return Plan(graph, ranges, _serial_levels(graph, None), concurrent=False, buffer_size=sum(sizes),
                profile=galloc.profile.name, graph_index=graph_index, unallocated=unallocated)


# --- plans for the harness graphs (fixtures/ggml-real/*/harness_*.json) ---------------------------
def _legacy_graph(desc: dict) -> Graph:
    """A graph for a 2023 walk; a head description gives views as view_src/view_offs, so VIEW ops
    get their offset relative to their source back (2023 addressed views by op offset)."""
    if not any("view_src" in n for n in desc["nodes"]):
        return graph_from_json(desc)
    graph = graph_from_json(desc, legacy=False)
    for t in graph.nodes:
        if t.op == "VIEW" and t.view_src is not None and not t.op_offset:
            parent = t.srcs[0]
            t.op_offset = t.view_offs - (parent.view_offs if parent.view_src is not None else 0)
    return graph


def _legacy_harness_plan(desc: dict, profile, use_parse_seq: bool, concurrent, buffer_size=None,
                         graph_index: int = 0) -> Plan:
    """The harness program's flow: explicit allocs, measure walk, then a real buffer of the measured size.

    A larger buffer_size stands for programs that allocated a fixed, generous compute buffer: the
    real allocator then places tensors as the measure walk did.
    """
    graph = _legacy_graph(desc)
    parse_seq = (desc.get("parse_seq") or None) if use_parse_seq else None
    align = desc.get("alignment", profile.alignment)

    def walk(alloc):
        for name in desc.get("explicit_allocs_before_graph", []):
            alloc.alloc_tensor(graph.by_name(name))
        alloc.alloc_graph(graph, parse_seq=parse_seq)
        return alloc

    measure = walk(LegacyAllocator.measure(profile, align))
    if measure.failed:
        raise ValueError(f"the {profile.name} allocator failed on this graph: {measure.failed.kind}")
    size = buffer_size or desc.get("real_buffer_size") or measure.t.max_size + align
    real = walk(LegacyAllocator.real(profile, LAYOUTS["linux"].buffer_base, size, align))
    if real.failed is None:
        return plan_from_legacy(graph, real, parse_seq, concurrent, graph_index)
    plan = plan_from_legacy(graph, measure, parse_seq, concurrent, graph_index)
    plan.note = f"the real allocation failed ({real.failed.kind} at {real.failed.tensor}); checking the measure plan"
    return plan


def harness_plans(desc: dict, profile_name: str, use_parse_seq: bool = False, concurrent: bool | None = None,
                  buffer_size: int | None = None) -> list[Plan]:
    """One plan per graph of a harness JSON (the head file holds several) under the given profile.

    With use_parse_seq the levels run concurrently unless concurrent=False (then parse_seq is
    only an order); buffer_size overrides the real buffer of the 2023 flow.
    """
    profile = get_profile(profile_name)
    graph_descs = desc.get("graphs") or [desc]
    if use_parse_seq and not desc.get("parse_seq"):
        raise ValueError("this harness graph has no parse_seq")
    if profile.family == "legacy":
        if len(graph_descs) > 1 or "graphs" in desc:
            plans = []
            for k, gd in enumerate(graph_descs):
                gd = dict(gd, alignment=desc.get("alignment", profile.alignment))
                plans.append(_legacy_harness_plan(gd, profile, False, concurrent, buffer_size, gd.get("step", k)))
            return plans
        return [_legacy_harness_plan(desc, profile, use_parse_seq, concurrent, buffer_size)]
    if use_parse_seq:
        raise ValueError(f"{profile.name} has no parse_seq: ggml-head dropped it")
    galloc = Gallocr(profile, desc.get("alignment", profile.alignment))
    plans = []
    for k, gd in enumerate(graph_descs):
        graph = graph_from_json(gd, legacy="graphs" not in desc)
        index = gd.get("step", k)
        if not galloc.alloc_graph(graph, graph_index=index):
            raise ValueError(f"the {profile.name} allocator failed on graph {index}: {galloc.failed.kind}")
        plans.append(plan_from_gallocr(graph, galloc, graph_index=index))
    return plans
