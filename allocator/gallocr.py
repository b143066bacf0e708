"""ggml-head's graph allocator (`ggml_gallocr`): plan in offsets, then place tensors.

`reserve` walks a graph and records a plan (buffer, chunk, offset per node and
source); `alloc_graph` reuses the plan when the new graph fits it, as ggml does,
and re-plans (printing why) when it does not.

A gallocr has n buffer types (`ggml_gallocr_new_n`): each node goes to the
buffer its `node_buffer_ids` entry names (leafs: `leaf_buffer_ids`), each buffer
type with its own alignment and maximum size. Buffer types that are the same
object in ggml share one allocator and one buffer (`BufferType.key`).
"""
from __future__ import annotations

from collections import defaultdict
from .record_class import record_class

from .dyn_tallocr import DynOutOfSpace, DynTallocr, SIZE_MAX
from .events import Event
from .profiles import Profile
from .tallocr import OutOfFreeBlocks, pad
from .tensor import Graph, Tensor, same_layout

INVALID = (-1, SIZE_MAX)
NO_ALLOC = (-1, INVALID, 0)  # a tensor_alloc for "no tensor here": ggml keeps one per src slot


class _Stop(Exception):
    pass


@record_class(frozen=True)
class BufferType:
    """One `ggml_backend_buffer_type` as the allocator sees it."""

    name: str = "CPU"
    alignment: int = 32
    max_size: int = SIZE_MAX
    key: object = None  # equal keys: the same buffer type object (shared allocator); None: distinct


class _HashNode:
    __slots__ = ("children", "views", "buffer_id", "chunk", "offset", "allocated")

    def __init__(self):
        self.children = self.views = 0
        self.buffer_id = 0
        self.chunk, self.offset = 0, 0
        self.allocated = False


class Gallocr:
    """One `ggml_gallocr`: a single buffer type (`alignment`, `max_buffer_size`) or n `buffer_types`.

    `alloc_size(tensor, buffer_id)` is what the buffer type allocates for a tensor
    (`ggml_backend_buft_get_alloc_size`); by default its nbytes."""

    def __init__(self, profile: Profile, alignment: int | None = None, max_buffer_size: int = SIZE_MAX,
                 buffer_type: str = "CPU", chunk_bases=None, buffer_types: list[BufferType] | None = None,
                 alloc_size=None):
        self.profile = profile
        if not buffer_types:
            buffer_types = [BufferType(buffer_type, alignment or profile.alignment, max_buffer_size)]
        self.buffer_types = list(buffer_types)
        # buffer i uses the allocator and buffer of the first buffer with the same type object
        self.owner = [next(j for j in range(i + 1) if j == i or (bt.key is not None and buffer_types[j].key == bt.key))
                      for i, bt in enumerate(buffer_types)]
        self.dyns = [DynTallocr(bt.alignment, bt.max_size, profile.max_free_blocks) if self.owner[i] == i else None
                     for i, bt in enumerate(buffer_types)]
        self.dyn = self.dyns[0]
        self.alloc_size = alloc_size or (lambda t, buffer_id: t.nbytes)
        self.chunk_bases = chunk_bases or [0x7F0000000000 + (c << 36) for c in range(16)]
        self.events: list[Event] = []
        self.data: dict[Tensor, int] = {}  # addresses set by alloc_graph, as tensor->data
        self.placement: dict[Tensor, tuple[int, int]] = {}  # (chunk, offset) of own tensors and views
        self.buffer_of: dict[Tensor, int] = {}  # the buffer id of each placed tensor
        self.node_allocs: list = []
        self.leaf_allocs: list = []
        self.n_nodes = self.n_leafs = 0
        self.buffer_chunk_sizes: list[list[int] | None] = [None] * len(buffer_types)  # the vbuffers
        self.failed: Event | None = None
        self.graph_index = 0
        self._ht: defaultdict[Tensor, _HashNode] = defaultdict(_HashNode)  # a tensor's entry made when first asked
        self._node = None

    # --- helpers ----------------------------------------------------------------------
    def addr(self, t: Tensor) -> int:
        return self.data.get(t, t.data)

    @property
    def n_buffers(self) -> int:
        return len(self.buffer_types)

    @property
    def chunk_sizes(self) -> list[int] | None:
        """Buffer 0's chunk sizes (None until its first reserve)."""
        return self.buffer_chunk_sizes[0]

    @property
    def buffer_size(self) -> int:
        return sum(self.buffer_sizes())

    def buffer_sizes(self) -> list[int]:
        """ggml_gallocr_get_buffer_size for every buffer id: a shared buffer counts once."""
        return [sum(self.buffer_chunk_sizes[i] or ()) if self.owner[i] == i else 0 for i in range(self.n_buffers)]

    def planned_sizes(self) -> list[int]:
        """What ggml_gallocr_reserve_n_size reports: each buffer's allocator high-water mark."""
        return [sum(ch.max_size for ch in self.dyns[self.owner[i]].chunks) for i in range(self.n_buffers)]

    def _dyn_of(self, buffer_id: int) -> DynTallocr:
        return self.dyns[self.owner[buffer_id]]

    def _base(self, buffer_id: int, chunk: int) -> int:
        return self.chunk_bases[chunk] + (buffer_id << 40)

    def _emit(self, kind: str, **kw) -> Event:
        ev = Event(kind, graph=self.graph_index, node=self._node, **kw)
        self.events.append(ev)
        return ev

    # --- allocation -------------------------------------------------------------------
    def _buf(self, buffer_id: int) -> int | None:
        """The event's `buffer`, only when there is more than one: the id whose buffer holds the
        bytes (ids of one buffer type object share the first one's)."""
        return self.owner[buffer_id] if len(self.buffer_types) > 1 else None

    def _alloc_bytes(self, node: Tensor, hn: _HashNode, buffer_id: int):
        dyn = self.dyns[self.owner[buffer_id]]
        hn.buffer_id = buffer_id
        size = self.alloc_size(node, buffer_id)
        try:
            chunk, block, off = dyn.alloc(size)
        except DynOutOfSpace as e:
            self.failed = self._emit("oom", tensor=node.name, op=node.op, needed=e.needed, largest=e.largest,
                                     buffer=self._buf(buffer_id))
            raise _Stop from None
        hn.chunk, hn.offset = chunk, off
        n_free, largest_free, total_free = dyn.summary()
        self.events.append(Event("alloc", graph=self.graph_index, node=self._node, tensor=node.name, op=node.op,
                                 size=pad(size, dyn.alignment), block=block, offset=off, chunk=chunk,
                                 buffer=self._buf(buffer_id), n_free=n_free, largest_free=largest_free,
                                 total_free=total_free))

    def _free_bytes(self, buffer_id: int, chunk: int, offset: int, nbytes: int, who: str):
        try:
            self._dyn_of(buffer_id).free(chunk, offset, nbytes)
        except OutOfFreeBlocks:
            self.failed = self._emit("abort", tensor=who, reason="out of free blocks")
            raise _Stop from None

    def _free_extra_space(self, node: Tensor, parent: Tensor):
        p, hn = self._ht[parent], self._ht[node]
        align = self._dyn_of(p.buffer_id).alignment
        psize = pad(self.alloc_size(parent, p.buffer_id), align)
        nsize = pad(self.alloc_size(node, hn.buffer_id), align)
        if psize > nsize:
            self._emit("free_extra", tensor=node.name, parent=parent.name, size=psize - nsize, chunk=p.chunk,
                       offset=p.offset + nsize, buffer=self._buf(p.buffer_id))
            self._free_bytes(p.buffer_id, p.chunk, p.offset + nsize, psize - nsize, node.name)

    def _reuse(self, node: Tensor, hn: _HashNode) -> bool:
        for parent in node.srcs:
            if parent is None:
                continue
            p = self._ht[parent]
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
                self._emit("reuse", tensor=node.name, op=node.op, parent=parent.name, chunk=p.chunk, offset=p.offset,
                           buffer=self._buf(p.buffer_id))
                hn.buffer_id, hn.chunk, hn.offset = p.buffer_id, p.chunk, p.offset
                p.allocated = False
                self._free_extra_space(node, parent)
                return True
        return False

    def _allocate_node(self, node: Tensor, buffer_id: int = 0):
        hn = self._ht[node]
        if hn.allocated or node.buffer or node.view_src is not None or self.data.get(node, node.data) != 0:
            return  # ours already, on a buffer already (not ours), or a view
        hn.allocated = True
        if node.op in self.profile.inplace_ops and self._reuse(node, hn):
            return
        self._alloc_bytes(node, hn, buffer_id)

    def _free_node(self, node: Tensor):
        if node.output:
            self._emit("not_freed", tensor=node.name)
            return
        hn = self._ht[node]
        dyn = self.dyns[self.owner[hn.buffer_id]]
        size = self.alloc_size(node, hn.buffer_id)
        ev = Event("free", graph=self.graph_index, node=self._node, tensor=node.name, op=node.op, size=size,
                   chunk=hn.chunk, offset=hn.offset, n_free_before=len(dyn.chunks[hn.chunk].sizes),
                   buffer=self._buf(hn.buffer_id))
        self.events.append(ev)  # before the free: a free that aborts follows it
        self._free_bytes(hn.buffer_id, hn.chunk, hn.offset, size, node.name)
        hn.allocated = False
        ev.n_free, ev.largest_free, ev.total_free = dyn.summary()

    def _walk(self, graph: Graph, node_ids=None, leaf_ids=None):
        self._ht = ht = defaultdict(_HashNode)
        self._node = None
        allocate = self._allocate_node
        for i, leaf in enumerate(graph.leafs):
            allocate(leaf, leaf_ids[i] if leaf_ids else 0)
        for i, node in enumerate(graph.nodes):
            bid = node_ids[i] if node_ids else 0
            if node.view_src is not None and node.op != "NONE":
                ht[node.view_src].views += 1
            if node.input:
                allocate(node, bid)
            for src in node.srcs:
                if src is None:
                    continue
                ht[src].children += 1
                if src.input:
                    allocate(src, bid)
        events, gi = self.events, self.graph_index
        for i, node in enumerate(graph.nodes):
            self._node = i
            bid = node_ids[i] if node_ids else 0
            srcs = node.srcs
            for parent in srcs:
                if parent is not None and not ht[parent].allocated:
                    allocate(parent, bid)
            allocate(node, bid)
            hn = ht[node]
            placed = hn.allocated
            events.append(Event("exec", graph=gi, node=i, tensor=node.name, op=node.op_desc,
                                srcs=[s.name if s else None for s in srcs], chunk=hn.chunk if placed else None,
                                offset=hn.offset if placed else None, size=node.nbytes))
            for parent in srcs:
                if parent is None:
                    continue
                p = ht[parent]
                p.children -= 1
                events.append(Event("parent", graph=gi, node=i, tensor=parent.name, children=p.children,
                                    views=p.views, allocated=int(p.allocated)))
                if p.children == 0 and p.views == 0:
                    vs = parent.view_src
                    if vs is not None:
                        v = ht[vs]
                        v.views -= 1
                        events.append(Event("view_src", graph=gi, node=i, tensor=vs.name, children=v.children,
                                            views=v.views))
                        if v.views == 0 and v.children == 0 and v.allocated:
                            self._free_node(vs)
                    elif p.allocated:
                        self._free_node(parent)
                events.append(Event("step", graph=gi, node=i))
        self._node = None

    # --- plan ---------------------------------------------------------------------------
    def _talloc(self, t: Tensor | None):
        if t is None or t.view_src is not None or self.data.get(t, t.data) != 0:
            return NO_ALLOC
        hn = self._ht[t]
        return (hn.buffer_id, (hn.chunk, hn.offset), self.alloc_size(t, hn.buffer_id))

    def reserve(self, graph: Graph, graph_index: int | None = None, node_buffer_ids=None, leaf_buffer_ids=None,
                no_alloc: bool = False) -> bool:
        """ggml_gallocr_reserve_n: plan the graph and grow each buffer the plan needs more of.
        `no_alloc` (reserve_n_size): plan only; a buffer that would grow is dropped instead."""
        if graph_index is not None:
            self.graph_index = graph_index
        if self.failed:
            return False
        for dyn in self.dyns:
            if dyn is not None:
                dyn.reset()
        try:
            self._walk(graph, node_buffer_ids, leaf_buffer_ids)
        except _Stop:
            self._node = None
            return False
        self.node_allocs = [(self._talloc(n), [self._talloc(s) for s in n.srcs]) for n in graph.nodes]
        self.leaf_allocs = [self._talloc(l) for l in graph.leafs]
        self.n_nodes, self.n_leafs = graph.n_nodes, graph.n_leafs
        for i, dyn in enumerate(self.dyns):
            if dyn is None:
                continue
            new_sizes = [ch.max_size for ch in dyn.chunks]
            cur = self.buffer_chunk_sizes[i]
            realloc = cur is None or any(n > (cur[c] if c < len(cur) else 0) for c, n in enumerate(new_sizes))
            if realloc:
                cur_size = sum(cur) if cur else 0
                if cur_size > 0:
                    self._emit("buffer", reason=self.buffer_types[i].name, size=sum(new_sizes),
                               extra={"from": cur_size}, buffer=self._buf(i))
                self.buffer_chunk_sizes[i] = None if no_alloc else new_sizes
        return True

    def _valid(self, t: Tensor, talloc) -> bool:
        if t.view_src is not None or self.data.get(t, t.data) != 0:
            return talloc[2] >= 0  # placed by someone else: needs no bytes of the plan
        return talloc[0] >= 0 and talloc[2] >= self.alloc_size(t, talloc[0])

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
            if self.n_buffers > 1:  # ggml: "cannot reallocate multi buffer graph automatically, call reserve"
                return False
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
            if self.data.get(t, t.data) == 0 and t.view_src in self.placement:
                c, o = self.placement[t.view_src]
                b = self.buffer_of[t.view_src]
                self.placement[t] = (c, o + t.view_offs)
                self.buffer_of[t] = b
                self.data[t] = self._base(b, c) + o + t.view_offs
            return
        if talloc[0] >= 0 and self.data.get(t, t.data) == 0:
            c, o = talloc[1]
            b = self.owner[talloc[0]]
            self.placement[t] = (c, o)
            self.buffer_of[t] = b
            self.data[t] = self._base(b, c) + o
