"""The 2023 graph walk (`ggml_allocr_alloc_graph`), profiles ggml-2023-08-16 and -08-28.

Tensors are never mutated: addresses live in `LegacyAllocator.data`, seeded
from `Tensor.data` (weights, KV cache), so one Graph can be walked by a measure
allocator and then by a real one, as llama.cpp did with two builds of a graph.
"""
from __future__ import annotations

from .events import Event
from .profiles import Profile
from .tallocr import LegacyTallocr, OutOfFreeBlocks, OutOfSpace, pad
from .tensor import VIEW_OPS_2023, Graph, Tensor, same_layout


class _Stop(Exception):
    """Unwinds the walk after the allocator asserted; the program would have aborted."""


def is_view(t: Tensor) -> bool:
    return t.op in VIEW_OPS_2023


def view_parent(t: Tensor) -> Tensor | None:
    if t.op == "CPY":
        return t.srcs[1]
    if t.op in VIEW_OPS_2023:
        return t.srcs[0]
    return None


def view_source(t: Tensor) -> Tensor:
    """Follow view parents up to the first tensor that is not a view."""
    p = view_parent(t)
    while is_view(p):
        p = view_parent(p)
    return p


class LegacyAllocator:
    """A `struct ggml_allocr` plus the events it would print. Stops at the first assert."""

    def __init__(self, profile: Profile, tallocr: LegacyTallocr):
        self.profile = profile
        self.t = tallocr
        self.events: list[Event] = []
        self.data: dict[Tensor, int] = {}
        self.failed: Event | None = None  # the oom/abort event, once the allocator died
        self.graph_index = 0
        self._ht: dict[Tensor, list] = {}
        self._node = None

    @classmethod
    def measure(cls, profile: Profile, alignment: int | None = None):
        return cls(profile, LegacyTallocr.new_measure(profile, alignment or profile.alignment))

    @classmethod
    def real(cls, profile: Profile, base: int, size: int, alignment: int | None = None):
        return cls(profile, LegacyTallocr(profile, base, size, alignment or profile.alignment))

    # --- addresses -------------------------------------------------------------------
    def addr(self, t: Tensor) -> int:
        return self.data.get(t, t.data)

    def offset_of(self, t: Tensor) -> int | None:
        a = self.addr(t)
        return a - self.t.base if a and self.t.inside(a) else None

    def _emit(self, kind: str, **kw) -> Event:
        ev = Event(kind, graph=self.graph_index, node=self._node, **kw)
        self.events.append(ev)
        return ev

    def _fill_free_list(self, ev: Event):
        ev.n_free, ev.largest_free, ev.total_free = self.t.summary()

    # --- ggml_allocr_alloc --------------------------------------------------------------
    def alloc_tensor(self, t: Tensor):
        """ggml_allocr_alloc: explicit allocation (inputs allocated by the program)."""
        if self.failed:
            return
        try:
            self._alloc(t)
        except _Stop:
            pass

    def _alloc(self, t: Tensor):
        size = pad(t.nbytes, self.t.alignment)
        try:
            choice = self.t.alloc(t.nbytes)
        except OutOfSpace as e:
            self._emit("alloc", tensor=t.name, op=t.op, size=size, block=-1)
            self.failed = self._emit("oom", tensor=t.name, op=t.op, needed=e.needed, largest=e.largest,
                                     size=size)
            self._fill_free_list(self.failed)
            raise _Stop from None
        self.data[t] = choice.addr
        ev = self._emit("alloc", tensor=t.name, op=t.op, size=size, block=choice.block, addr=choice.addr,
                        offset=choice.addr - self.t.base)
        self._fill_free_list(ev)

    def _free(self, t: Tensor):
        ptr = self.addr(t)
        if not self.t.owns(ptr):
            return  # weights and other buffers' tensors: ignored, silently
        ev = self._emit("free", tensor=t.name, op=t.op, size=pad(t.nbytes, self.t.alignment), addr=ptr,
                        offset=ptr - self.t.base, n_free_before=len(self.t.sizes))
        try:
            self.t.free(ptr, t.nbytes)
        except OutOfFreeBlocks:
            self.failed = self._emit("abort", tensor=t.name, reason="out of free blocks")
            raise _Stop from None
        self._fill_free_list(ev)

    def reset(self):
        self.t.reset()

    # --- graph walk -------------------------------------------------------------------
    def _allocate_node(self, node: Tensor):
        data = self.data
        if self.addr(node) != 0:
            return
        if is_view(node):
            if node.op == "VIEW":
                a = self.addr(node.srcs[0]) + node.op_offset
            elif node.op == "CPY":
                a = self.addr(node.srcs[1])
            else:
                a = self.addr(node.srcs[0])
            data[node] = a
            self._emit("view", tensor=node.name, op=node.op, addr=a, view_src=view_source(node).name,
                       offset=a - self.t.base if self.t.inside(a) else None)
            return
        if node.op in self.profile.inplace_ops:
            ht = self._ht
            for parent in node.srcs:
                if parent is None:
                    break
                pdata = self.addr(parent)
                if not self.t.inside(pdata):
                    self._emit("no_reuse", tensor=node.name, parent=parent.name, reason="external", addr=pdata)
                    continue
                p = ht.get(parent) or [0, 0]
                if pdata != 0 and p[0] == 1 and p[1] == 0 and same_layout(node, parent):
                    if is_view(parent):
                        vs = view_source(parent)
                        v = ht.get(vs) or [0, 0]
                        if v[1] == 1 and v[0] == 0 and self.addr(vs) == pdata:
                            data[node] = pdata
                            self._emit("reuse", tensor=node.name, op=node.op, parent=parent.name, view_src=vs.name,
                                       addr=pdata, offset=pdata - self.t.base)
                            return
                        if self.profile.view_parent_returns:
                            return  # 854e4530: the node is left without memory
                    else:
                        data[node] = pdata
                        self._emit("reuse", tensor=node.name, op=node.op, parent=parent.name, addr=pdata,
                                   offset=pdata - self.t.base)
                        return
        self._alloc(node)

    def _count(self, graphs):
        ht: dict[Tensor, list] = {}
        for gf in graphs:
            for node in gf.nodes:
                if is_view(node):
                    ht.setdefault(view_source(node), [0, 0])[1] += 1
                for parent in node.srcs:
                    if parent is None:
                        break
                    ht.setdefault(parent, [0, 0])[0] += 1
        self._ht = ht

    def _update_parents(self, node: Tensor):
        ht = self._ht
        node_data = self.addr(node)
        for parent in node.srcs:
            if parent is None:
                break
            p = ht.setdefault(parent, [0, 0])
            p[0] -= 1
            if p[0] == 0 and p[1] == 0:
                if is_view(parent):
                    vs = view_source(parent)
                    v = ht.setdefault(vs, [0, 0])
                    v[1] -= 1
                    self._emit("view_src", tensor=vs.name, children=v[0], views=v[1])
                    if v[1] == 0 and v[0] == 0 and self.addr(vs) != node_data:
                        self._free(vs)
                elif self.addr(parent) != node_data:
                    self._free(parent)

    def _place(self, i: int, node: Tensor):
        self._node = i
        for parent in node.srcs:
            if parent is None:
                break
            self._allocate_node(parent)
        self._allocate_node(node)
        srcs = []
        for s in node.srcs:
            if s is None:
                break
            srcs.append(s.name)
        a = self.addr(node)
        self._emit("exec", tensor=node.name, op=node.op, srcs=srcs, addr=a,
                   offset=a - self.t.base if self.t.inside(a) else None, size=node.nbytes)

    def alloc_graph(self, graph: Graph, parse_seq=None, inputs=None, outputs=None, graph_index=0,
                    n_graphs=1) -> int:
        """ggml_allocr_alloc_graph; returns max_size (a running maximum, as in ggml)."""
        return self.alloc_graphs([graph], parse_seq, [inputs] if inputs else None, [outputs] if outputs else None,
                                 first_index=graph_index)

    def alloc_graphs(self, graphs, parse_seq=None, inputs=None, outputs=None, first_index=0) -> int:
        """ggml_allocator_alloc_graph_tensors_n: several graphs sharing one hash table."""
        if self.failed:
            return self.t.max_size
        self._count(graphs)
        try:
            for g, gf in enumerate(graphs):
                self.graph_index = first_index + g
                self._node = None
                self._emit("graph", extra={"g": g, "n": len(graphs)})
                for t in (inputs[g] if inputs and inputs[g] else []):
                    self._emit("input", tensor=t.name)
                    self._allocate_node(t)
                self._walk(gf, parse_seq)
                self._node = None
                for t in (outputs[g] if outputs and outputs[g] else []):
                    self._emit("output", tensor=t.name)
                    self._free(t)
        except _Stop:
            pass
        self._node = None
        return self.t.max_size

    def _walk(self, gf: Graph, parse_seq):
        nodes = gf.nodes
        if parse_seq and self.profile.parse_seq == "barrier":
            last_barrier = 0
            for ind, i in enumerate(parse_seq):
                if i != -1:
                    self._place(i, nodes[i])
                    continue
                for k in range(last_barrier, ind):
                    self._node = parse_seq[k]
                    self._update_parents(nodes[parse_seq[k]])
                self._node = None
                self._emit("barrier")
                last_barrier = ind + 1
            return
        order = [i for i in parse_seq if i != -1] if parse_seq else range(len(nodes))
        for i in order:
            node = nodes[i]
            self._place(i, node)
            self._update_parents(node)
            self._emit("step")
