"""Run a planned graph for real on one byte arena and compare it with private-memory execution.

The reference gives every tensor its own memory (views share their source's),
so its values are what the graph means. The planned run puts every tensor at
its planned offset in one numpy uint8 arena, filled with seeded garbage, so a
tensor overwritten too early, or read before it was written, shows up as a
different value. Concurrent levels run one node at a time in an order chosen
to expose races: "adversarial" puts every node that writes bytes another node
of the level reads before that reader, as a GPU may when frees did not wait
for the barrier (llama.cpp PR #2757).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .hazards import IntervalMap, Label
from .kernels import DTYPES, UnsupportedOp, compute, shape_of
from .plan import Plan, extent, graph_outputs, input_roots, read_srcs, root_of, writes

ORDERS = ("adversarial", "shuffled", "graph")
OUTPUT_READER = "<graph output>"


@dataclass
class Corruption:
    """The first wrong value a node read: which tensor, read by whom, and who wrote over it."""

    reader: str
    tensor: str
    overwriter: str | None
    offset: int | None  # the tensor's byte range in the buffer
    size: int | None
    max_abs_diff: float


@dataclass
class ExecResult:
    order: list  # node indices in the order they ran
    mismatched: list = field(default_factory=list)  # nodes whose output differs from the reference
    first: Corruption | None = None

    @property
    def ok(self) -> bool:
        return self.first is None and not self.mismatched


def _private_sizes(graph) -> dict:
    """Bytes of private memory per root tensor: up to the furthest byte any tensor viewing it reaches."""
    need: dict = {}
    for t in graph.tensors():
        root, off = root_of(t)
        need[root] = max(need.get(root, 0), off + extent(t))
    return need


def _arena_size(plan: Plan) -> int:
    """The arena's bytes: the buffer, or further where a planned range reaches past it."""
    return max([plan.buffer_size] + [r[1] for r in plan.ranges.values() if r is not None])


class Memory:
    """Where each tensor's bytes live: the arena at its planned offset, or private memory per root tensor."""

    def __init__(self, graph, plan: Plan | None = None):
        self.plan = plan
        for t in graph.tensors():
            if t.type not in DTYPES:
                raise UnsupportedOp(f"no numpy type for {t.type} ({t.name})")
        self.private = {root: np.zeros(n, dtype=np.uint8) for root, n in _private_sizes(graph).items()}
        self.arena = None
        if plan is not None:
            rng = np.random.default_rng(0xA110C)
            self.arena = rng.integers(0, 256, size=_arena_size(plan), dtype=np.uint8)

    def array(self, t) -> np.ndarray:
        """A strided numpy view of t's elements, shaped (ne3, ne2, ne1, ne0)."""
        r = self.plan.range(t) if self.plan is not None else None
        if r is not None:
            buf, off = self.arena, r[0]
        else:
            root, off = root_of(t)
            buf = self.private[root]
        flat = buf[off:off + extent(t)].view(DTYPES[t.type])
        return as_strided(flat, shape=shape_of(t), strides=tuple(reversed(t.nb)))

    def load(self, t) -> np.ndarray:
        return np.array(self.array(t))

    def store(self, t, value: np.ndarray):
        self.array(t)[...] = value


def leaf_value(t, graph, seed: int) -> np.ndarray:
    """Seeded data for a weight or input: small normals, a positive scalar, or valid row indices."""
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    shape = shape_of(t)
    if t.type.startswith("i"):
        for node in graph.nodes:
            if node.op == "GET_ROWS" and len(node.srcs) > 1 and node.srcs[1] is t:
                return rng.integers(0, node.srcs[0].ne[1], size=shape).astype(DTYPES[t.type])
        return np.arange(int(np.prod(shape))).reshape(shape).astype(DTYPES[t.type])
    if int(np.prod(shape)) == 1:
        return rng.uniform(0.1, 1.0, size=shape).astype(DTYPES[t.type])
    return (rng.standard_normal(shape) * 0.5).astype(DTYPES[t.type])


def _fill_leafs(mem: Memory, graph, seed: int, on_store=None):
    """Weights and external tensors live privately; inputs are written where the plan puts them."""
    filled = set()
    for leaf in input_roots(graph):
        mem.store(leaf, leaf_value(leaf, graph, seed))
        filled.add(leaf)
        if on_store:
            on_store(leaf)
    for leaf in graph.leafs:  # the rest: only external memory, never into the arena
        if leaf not in filled and root_of(leaf)[0] is leaf and (mem.plan is None or mem.plan.range(leaf) is None):
            mem.store(leaf, leaf_value(leaf, graph, seed))


def _slot_inputs(node):
    reads = set(map(id, read_srcs(node)))
    return [s if s is not None and id(s) in reads else None for s in node.srcs]


@dataclass
class Reference:
    inputs: dict  # node -> list of values per src slot (None where not read)
    outputs: dict  # node -> its value after it ran


def reference_run(graph, params: dict | None = None, seed: int = 0, on_node=None) -> Reference:
    """Private memory, graph order: what every node should read and produce."""
    params = params or {}
    mem = Memory(graph)
    _fill_leafs(mem, graph, seed)
    ref = Reference({}, {})
    for node in graph.nodes:
        if on_node:
            on_node()
        if not writes(node):
            continue
        ins = [mem.load(s) if s is not None else None for s in _slot_inputs(node)]
        ref.inputs[node] = ins
        mem.store(node, compute(node, ins, params.get(node.name)))
        ref.outputs[node] = mem.load(node)
    return ref


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        d = d[~(np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))]
        return float(np.nanmax(np.where(np.isnan(d), np.inf, d))) if d.size else 0.0


def level_order(plan: Plan, level: list, order: str, rng) -> list:
    """The order a level's nodes run in, one at a time."""
    if order == "graph" or len(level) < 2:
        return list(level)
    if order == "shuffled":
        return [level[i] for i in rng.permutation(len(level))]
    nodes = plan.graph.nodes
    before = {i: set() for i in level}  # i must run after every node in before[i]
    for a in level:
        wa = plan.range(nodes[a]) if writes(nodes[a]) else None
        if wa is None:
            continue
        for b in level:
            if b != a and any(r is not None and r[0] < wa[1] and wa[0] < r[1]
                              for r in map(plan.range, read_srcs(nodes[b]))):
                before[b].add(a)
    out, left = [], list(level)
    while left:
        ready = [i for i in left if not (before[i] & set(left))] or left[:1]  # a cycle: break it in level order
        out.append(ready[0])
        left.remove(ready[0])
    return out


class WriteLog:
    """Who wrote which bytes, remembering for every tensor the writes that landed on its data."""

    def __init__(self):
        self.current = IntervalMap()
        self.clobbers: dict = {}  # root -> [(start, end, writer)] in write order

    def wrote(self, t, r):
        mine = root_of(t)[0]
        for a, b, label in self.current.overlapping(*r):
            if label.root is not mine:
                self.clobbers.setdefault(label.root, []).append((a, b, t))
        self.current.assign(r[0], r[1], Label(mine, t))

    def overwriter(self, t, r) -> str | None:
        """The first tensor that wrote over t's bytes after they held t's data."""
        if r is None:
            return None
        for a, b, writer in self.clobbers.get(root_of(t)[0], []):
            if a < r[1] and r[0] < b:
                return writer.name
        mine = root_of(t)[0]
        for _, _, label in self.current.overlapping(*r):
            if label.root is not mine:
                return label.writer.name
        return "<never written>" if self.current.gaps(*r) else None


def _elements(t) -> int:
    n = 1
    for d in t.ne:
        n *= max(d, 0)
    return n


def _dense_bytes(t) -> int:
    """Bytes of a dense copy of t's elements (what `Memory.load` returns)."""
    return _elements(t) * np.dtype(DTYPES.get(t.type, np.uint8)).itemsize


WORK_COPIES = 4


def estimate_bytes(plan: Plan) -> int:
    """Memory a numeric run of the plan allocates at its peak, before any of it is allocated.

    The reference keeps a copy of every node's inputs and output; the planned run then holds private
    memory for every root tensor (weights, KV cache) and the arena, while kernels compute one node in
    float64 (a kernel holds up to WORK_COPIES float64 copies of its operands at once: softmax's shifted,
    exponentiated and normalized values). The reference's own private memory is freed before the planned run's is made, so the
    peak is the kept copies, one set of private memory, the arena and the largest node's float64 work.
    """
    kept, work = 0, 0
    for node in plan.graph.nodes:
        if not writes(node):
            continue
        srcs = read_srcs(node)
        kept += sum(map(_dense_bytes, srcs)) + _dense_bytes(node)
        work = max(work, WORK_COPIES * 8 * (sum(map(_elements, srcs)) + _elements(node)))
    return sum(_private_sizes(plan.graph).values()) + _arena_size(plan) + kept + work


def run(plan: Plan, order: str = "adversarial", seed: int = 0, params: dict | None = None,
        on_node=None) -> ExecResult:
    """Execute the plan on one arena; compare every read and every output with the reference.

    on_node() is called once per node of the reference run and once per node of the planned run
    (2 * n_nodes calls), for progress bars."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; known: {', '.join(ORDERS)}")
    params = {**plan.params, **(params or {})}
    graph = plan.graph
    ref = reference_run(graph, params, seed, on_node)
    mem = Memory(graph, plan)
    log = WriteLog()

    def wrote(t):
        r = plan.range(t)
        if r is not None:
            log.wrote(t, r)

    _fill_leafs(mem, graph, seed, on_store=wrote)
    result = ExecResult(order=[])
    rng = np.random.default_rng(seed)

    def corrupted(reader: str, t, got, want):
        if result.first is None:
            r = plan.range(t)
            result.first = Corruption(reader, t.name, log.overwriter(t, r), r[0] if r else None,
                                      r[1] - r[0] if r else None, _max_diff(got, want))

    for step in plan.steps():
        for i in level_order(plan, step, order, rng):
            node = graph.nodes[i]
            result.order.append(i)
            if on_node:
                on_node()
            if not writes(node):
                continue
            ins = []
            for slot, s in enumerate(_slot_inputs(node)):
                if s is None:
                    ins.append(None)
                    continue
                got = mem.load(s)
                if not _same(got, ref.inputs[node][slot]):
                    corrupted(node.name, s, got, ref.inputs[node][slot])
                ins.append(got)
            mem.store(node, compute(node, ins, params.get(node.name)))
            wrote(node)
            if not _same(mem.load(node), ref.outputs[node]):
                result.mismatched.append(node.name)
    for out in graph_outputs(graph):
        if out in ref.outputs:
            got = mem.load(out)
            if not _same(got, ref.outputs[out]):
                corrupted(OUTPUT_READER, out, got, ref.outputs[out])
                if out.name not in result.mismatched:
                    result.mismatched.append(out.name)
    return result


def describe(result: ExecResult) -> str:
    """One line for people."""
    if result.ok:
        return f"numeric run equals the reference ({len(result.order)} nodes)"
    c = result.first
    if c is None:
        return f"outputs differ from the reference: {', '.join(result.mismatched)}"
    where = f" [bytes {c.offset}..{c.offset + c.size})" if c.offset is not None else " (outside the buffer)"
    by = c.overwriter or "an unordered write (read before its writer ran, or during it)"
    return (f"first corrupted tensor: {c.tensor}{where}, read by {c.reader}, overwritten by {by} "
            f"(max abs diff {c.max_abs_diff:g}); {len(result.mismatched)} node outputs differ")
