"""ggml-head's graph allocator (`ggml_gallocr`): plan in offsets, then place tensors.

`reserve` walks a graph and records a plan (chunk, offset per node and source);
`alloc_graph` reuses the plan when the new graph fits it, as ggml does, and
re-plans (printing why) when it does not.
"""
from __future__ import annotations

from .dyn_tallocr import DynOutOfSpace, DynTallocr, SIZE_MAX
from .events import Event
from .profiles import Profile
from .tallocr import OutOfFreeBlocks, pad
from .tensor import Graph, Tensor, same_layout

INVALID = (-1, SIZE_MAX)
NO_ALLOC = (-1, INVALID, 0)  # a tensor_alloc for "no tensor here": ggml keeps one per src slot


class _Stop(Exception):
    pass


class _HashNode:
    __slots__ = ("children", "views", "chunk", "offset", "allocated")

    def __init__(self):
        self.children = self.views = 0
        self.chunk, self.offset = 0, 0
        self.allocated = False


def is_view(t: Tensor) -> bool:
    return t.view_src is not None


class Gallocr:
    """One `ggml_gallocr` with a single buffer type."""

    def __init__(self, profile: Profile, alignment: int | None = None, max_buffer_size: int = SIZE_MAX,
                 buffer_type: str = "CPU", chunk_bases=None):
        self.profile = profile
        self.dyn = DynTallocr(alignment or profile.alignment, max_buffer_size, profile.max_free_blocks)
        self.buffer_type = buffer_type
        self.chunk_bases = chunk_bases or [0x7F0000000000 + (c << 36) for c in range(16)]
        self.events: list[Event] = []
        self.data: dict[Tensor, int] = {}  # addresses set by alloc_graph, as tensor->data
        self.placement: dict[Tensor, tuple[int, int]] = {}  # (chunk, offset) of own tensors and views
        self.node_allocs: list = []
        self.leaf_allocs: list = []
        self.n_nodes = self.n_leafs = 0
        self.chunk_sizes: list[int] | None = None  # the vbuffer; None until first reserve
        self.failed: Event | None = None
        self.graph_index = 0
        self._ht: dict[Tensor, _HashNode] = {}
        self._node = None

    # --- helpers ----------------------------------------------------------------------
    def addr(self, t: Tensor) -> int:
        return self.data.get(t, t.data)

    @property
    def buffer_size(self) -> int:
        return sum(self.chunk_sizes) if self.chunk_sizes else 0

    def _emit(self, kind: str, **kw) -> Event:
        ev = Event(kind, graph=self.graph_index, node=self._node, **kw)
        self.events.append(ev)
        return ev

    def _hn(self, t: Tensor) -> _HashNode:
        hn = self._ht.get(t)
        if hn is None:
            hn = self._ht[t] = _HashNode()
        return hn

    def _is_allocated(self, t: Tensor) -> bool:
        return self.addr(t) != 0 or self._hn(t).allocated

    # --- allocation -------------------------------------------------------------------
    def _alloc_bytes(self, node: Tensor, hn: _HashNode):
        try:
            chunk, block, off = self.dyn.alloc(node.nbytes)
        except DynOutOfSpace as e:
            self.failed = self._emit("oom", tensor=node.name, op=node.op, needed=e.needed, largest=e.largest)
            raise _Stop from None
        hn.chunk, hn.offset = chunk, off
        ev = self._emit("alloc", tensor=node.name, op=node.op, size=pad(node.nbytes, self.dyn.alignment),
                        block=block, offset=off, chunk=chunk)
        ev.n_free, ev.largest_free, ev.total_free = self.dyn.summary()

    def _free_bytes(self, chunk: int, offset: int, nbytes: int, who: str):
        try:
            self.dyn.free(chunk, offset, nbytes)
        except OutOfFreeBlocks:
            self.failed = self._emit("abort", tensor=who, reason="out of free blocks")
            raise _Stop from None

    def _free_extra_space(self, node: Tensor, parent: Tensor):
        p = self._hn(parent)
        psize, nsize = pad(parent.nbytes, self.dyn.alignment), pad(node.nbytes, self.dyn.alignment)
        if psize > nsize:
            self._emit("free_extra", tensor=node.name, parent=parent.name, size=psize - nsize, chunk=p.chunk,
                       offset=p.offset + nsize)
            self._free_bytes(p.chunk, p.offset + nsize, psize - nsize, node.name)

    def _reuse(self, node: Tensor, hn: _HashNode) -> bool:
        for parent in node.srcs:
            if parent is None:
                continue
            p = self._hn(parent)
            if not p.allocated:
                self._emit("no_reuse", tensor=node.name, parent=parent.name, reason="external", addr=self.addr(parent))
                continue
            if parent.output or (parent.view_src is not None and parent.view_src.output):
                self._emit("no_reuse", tensor=node.name, parent=parent.name, reason="output")
                continue
            if not same_layout(node, parent):
                self._emit("no_reuse", tensor=node.name, parent=parent.name, reason="layout")
                continue
            if p.children == 1 and p.views == 0:
                # a view is never "own" (views are not allocated), so only plain parents get here
                self._emit("reuse", tensor=node.name, op=node.op, parent=parent.name, chunk=p.chunk, offset=p.offset)
                hn.chunk, hn.offset = p.chunk, p.offset
                p.allocated = False
                self._free_extra_space(node, parent)
                return True
        return False

    def _allocate_node(self, node: Tensor):
        hn = self._hn(node)
        if self._is_allocated(node) or is_view(node):
            return
        hn.allocated = True
        if node.op in self.profile.inplace_ops and self._reuse(node, hn):
            return
        self._alloc_bytes(node, hn)

    def _free_node(self, node: Tensor):
        if node.output:
            self._emit("not_freed", tensor=node.name)
            return
        hn = self._hn(node)
        ch = self.dyn.chunks[hn.chunk]
        ev = self._emit("free", tensor=node.name, op=node.op, size=node.nbytes, chunk=hn.chunk, offset=hn.offset,
                        n_free_before=len(ch.sizes))
        self._free_bytes(hn.chunk, hn.offset, node.nbytes, node.name)
        hn.allocated = False
        ev.n_free, ev.largest_free, ev.total_free = self.dyn.summary()

    def _walk(self, graph: Graph):
        self._ht = {}
        self._node = None
        for leaf in graph.leafs:
            self._allocate_node(leaf)
        for node in graph.nodes:
            if is_view(node) and node.op != "NONE":
                self._hn(node.view_src).views += 1
            if node.input:
                self._allocate_node(node)
            for src in node.srcs:
                if src is None:
                    continue
                self._hn(src).children += 1
                if src.input:
                    self._allocate_node(src)
        for i, node in enumerate(graph.nodes):
            self._node = i
            for parent in node.srcs:
                if parent is not None:
                    self._allocate_node(parent)
            self._allocate_node(node)
            hn = self._hn(node)
            place = (hn.chunk, hn.offset) if hn.allocated else (None, None)
            self._emit("exec", tensor=node.name, op=node.op_desc, srcs=[s.name if s else None for s in node.srcs],
                       chunk=place[0], offset=place[1], size=node.nbytes)
            for parent in node.srcs:
                if parent is None:
                    continue
                p = self._hn(parent)
                p.children -= 1
                self._emit("parent", tensor=parent.name, children=p.children, views=p.views,
                           allocated=int(p.allocated))
                if p.children == 0 and p.views == 0:
                    if is_view(parent):
                        vs = parent.view_src
                        v = self._hn(vs)
                        v.views -= 1
                        self._emit("view_src", tensor=vs.name, children=v.children, views=v.views)
                        if v.views == 0 and v.children == 0 and v.allocated:
                            self._free_node(vs)
                    elif p.allocated:
                        self._free_node(parent)
                self._emit("step")
        self._node = None

    # --- plan ---------------------------------------------------------------------------
    def _talloc(self, t: Tensor | None):
        if t is None or t.view_src is not None or self.addr(t) != 0:
            return NO_ALLOC
        hn = self._hn(t)
        return (0, (hn.chunk, hn.offset), t.nbytes)

    def reserve(self, graph: Graph, graph_index: int | None = None) -> bool:
        """ggml_gallocr_reserve: plan the graph and grow the buffer if the plan needs more."""
        if graph_index is not None:
            self.graph_index = graph_index
        if self.failed:
            return False
        self.dyn.reset()
        try:
            self._walk(graph)
        except _Stop:
            self._node = None
            return False
        self.node_allocs = [(self._talloc(n), [self._talloc(s) for s in n.srcs]) for n in graph.nodes]
        self.leaf_allocs = [self._talloc(l) for l in graph.leafs]
        self.n_nodes, self.n_leafs = graph.n_nodes, graph.n_leafs
        new_sizes = [ch.max_size for ch in self.dyn.chunks]
        cur = self.chunk_sizes
        realloc = cur is None or any(n > (cur[c] if c < len(cur) else 0) for c, n in enumerate(new_sizes))
        if realloc:
            cur_size = sum(cur) if cur else 0
            if cur_size > 0:
                self._emit("buffer", reason=self.buffer_type, size=sum(new_sizes), extra={"from": cur_size})
            self.chunk_sizes = new_sizes
        return True

    def _valid(self, t: Tensor, talloc) -> bool:
        size = 0
        if self.addr(t) == 0 and t.view_src is None:
            if talloc[0] < 0:
                return False
            size = t.nbytes
        return talloc[2] >= size

    def needs_realloc(self, graph: Graph) -> str | None:
        """Why the recorded plan cannot serve this graph (the text ggml prints), or None."""
        if self.n_nodes != graph.n_nodes:
            return "graph has different number of nodes"
        if self.n_leafs != graph.n_leafs:
            return "graph has different number of leafs"
        for node, (dst, srcs) in zip(graph.nodes, self.node_allocs):
            if not self._valid(node, dst):
                return f"node {node.name} is not valid"
            for j, src in enumerate(node.srcs):
                if src is not None and not self._valid(src, srcs[j] if j < len(srcs) else NO_ALLOC):
                    return f"src {j} ({src.name}) of node {node.name} is not valid"
        return None

    def alloc_graph(self, graph: Graph, graph_index: int | None = None) -> bool:
        """ggml_gallocr_alloc_graph: re-plan when needed, then give every tensor its address."""
        if graph_index is not None:
            self.graph_index = graph_index
        if self.failed:
            return False
        why = self.needs_realloc(graph)
        if why:
            self._emit("realloc", reason=why)
            if not self.reserve(graph):
                return False
        else:
            self._emit("plan_reused")
        for leaf, talloc in zip(graph.leafs, self.leaf_allocs):
            self._init_tensor(leaf, talloc)
        for node, (dst, srcs) in zip(graph.nodes, self.node_allocs):
            for j, src in enumerate(node.srcs):
                if src is not None:
                    self._init_tensor(src, srcs[j] if j < len(srcs) else NO_ALLOC)
            self._init_tensor(node, dst)
        return True

    def _init_tensor(self, t: Tensor, talloc):
        if t.view_src is not None:
            if self.addr(t) == 0 and t.view_src in self.placement:
                c, o = self.placement[t.view_src]
                self.placement[t] = (c, o + t.view_offs)
                self.data[t] = self.chunk_bases[c] + o + t.view_offs
            return
        if self.addr(t) == 0 and talloc[0] >= 0:
            c, o = talloc[1]
            self.placement[t] = (c, o)
            self.data[t] = self.chunk_bases[c] + o
