"""Metal's concurrency reorder (`ggml_metal_graph_find_concurrency`, ggml ea9193f0).

Nodes are grouped into levels: scanning the unplaced nodes in index order, a
node joins the current level when each source is a leaf or a node placed in
an earlier level (with `check_mem`, also when no earlier unplaced non-view
node's memory overlaps its own). Each level is appended in index order and
closed by -1. llama.cpp ran it once on the worst-case graph and gave the same
list to the measure and the real allocator (`ggml_allocr_set_parse_seq`).
"""
from __future__ import annotations

from dataclasses import dataclass

from alloctrace.allocator.tensor import Graph, Tensor

MAX_CONCUR_2023 = 4096  # GGML_MAX_NODES entries: the array 70B overflowed (llama.cpp PR #2776)
_NO_MEM_CHECK = frozenset({"RESHAPE", "VIEW", "TRANSPOSE", "PERMUTE"})


def _is_leaf(t: Tensor) -> bool:
    return t.op == "NONE" and not t.param


def find_concurrency(graph: Graph, check_mem: bool = False, addr=None) -> list[int]:
    """The parse_seq: node indices level by level, each level followed by -1.

    `addr(t)` gives a node's address for the memory check (default: `t.data`,
    which is 0 for nodes not yet allocated, as it was when llama.cpp called it)."""
    if check_mem:
        return _scan(graph, addr or (lambda t: t.data))
    return _by_depth(graph)


def _by_depth(graph: Graph) -> list[int]:
    """Without the memory check a node lands on the first level after all its node sources:
    its level is one more than its deepest source's. Same list as the scan, in linear time."""
    pos = {t: i for i, t in enumerate(graph.nodes)}
    level = []
    for i, node in enumerate(graph.nodes):
        lv = 0
        for s in node.srcs:
            if s is None or _is_leaf(s):
                continue
            j = pos.get(s)
            if j is None or j >= i:
                raise ValueError(f"source {s.name!r} of node {i} ({node.name!r}) is not an earlier node")
            lv = max(lv, level[j] + 1)
        level.append(lv)
    buckets: list[list[int]] = [[] for _ in range(max(level, default=-1) + 1)]
    for i, lv in enumerate(level):
        buckets[lv].append(i)
    seq: list[int] = []
    for b in buckets:
        seq.extend(b)
        seq.append(-1)
    return seq


def _scan(graph: Graph, addr) -> list[int]:
    """The level-by-level scan of the C code, including the memory overlap check."""
    nodes = graph.nodes
    n = len(nodes)
    unused = [True] * n
    placed: set = set()  # nodes in finished levels
    seq: list[int] = []
    n_left, n_start = n, 0
    while n_left > 0:
        level = []
        for i in range(n_start, n):
            if not unused[i]:
                continue
            node = nodes[i]
            ok = all(s is None or _is_leaf(s) or s in placed for s in node.srcs)
            if ok:
                start, length = addr(node), node.nbytes
                for j in range(n_start, i):
                    other = nodes[j]
                    if unused[j] and other.op not in _NO_MEM_CHECK:
                        a = addr(other)
                        if not (a >= start + length or a + other.nbytes <= start):
                            ok = False
            if ok:
                level.append(i)
                unused[i] = False
        if not level:
            raise ValueError("no node can be scheduled: the graph has a source that is not an earlier node")
        n_left -= len(level)
        seq.extend(level)
        seq.append(-1)
        placed.update(nodes[i] for i in level)
        while n_start < n and not unused[n_start]:
            n_start += 1
    return seq


@dataclass(frozen=True)
class ConcurrencyReport:
    length: int  # entries including the -1 barriers: n_nodes + n_levels
    n_levels: int
    capacity: int
    overflows: bool  # the 2023 list could not hold it

    def to_json(self) -> dict:
        return {"length": self.length, "n_levels": self.n_levels, "capacity": self.capacity,
                "overflows": self.overflows}


def report(seq: list[int], capacity: int = MAX_CONCUR_2023) -> ConcurrencyReport:
    return ConcurrencyReport(len(seq), seq.count(-1), capacity, len(seq) > capacity)
