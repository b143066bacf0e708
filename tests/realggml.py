"""Run one "op program" in real ggml (through ggml-python) and in the model, side by side.

An op program is a list of `Step`s, each calling one ggml graph-building function
by its name without the `ggml_` prefix (`Step("add", (Ref(0), Ref(1)))`). An
argument `Ref(k)` stands for the tensor made by step k; a type name ("f32")
stands for the ggml type; anything else is passed as is. Every step makes
exactly one tensor, so tensors are identified by their step index.

Both sides are built in lockstep and every tensor's type, shape, strides,
name and view source are compared as soon as it exists: a later step is only
valid for ggml if the earlier shapes are what the generator believed, and an
invalid call would abort the whole process instead of failing one test.
Then both graphs are allocated with a graph allocator (`ggml_gallocr` and
`Gallocr`), and `Placement` reports where every tensor of the allocator's
buffer landed.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import ggml  # ggml-python; a missing package must fail the differential tests, not skip them

from alloctrace.allocator import Gallocr, get_profile
from alloctrace.allocator.build import Ctx
from alloctrace.allocator.tensor import TYPE_SIZE

GGML_TYPES = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "i32": ggml.GGML_TYPE_I32}
TYPE_NAMES = {v: k for k, v in GGML_TYPES.items()}
EXTERNAL_BASE = 0x7E0000000000  # where the model puts weights: far from its own buffer chunks
ALIGNMENT = 32  # the CPU buffer type's alignment (TENSOR_ALIGNMENT)


@dataclass(frozen=True)
class Ref:
    """The tensor made by step `index`."""

    index: int


@dataclass(frozen=True)
class Step:
    op: str  # ggml function name without the prefix: new_tensor_2d, add, view_2d, ...
    args: tuple = ()
    name: str = ""  # ggml_set_name after creation; "" keeps ggml's own name
    input: bool = False
    output: bool = False
    external: bool = False  # new_tensor_* only: the tensor has memory of its own (a weight)


@dataclass(frozen=True)
class Program:
    steps: tuple
    roots: tuple  # step indices handed to ggml_build_forward_expand, in order

    def describe(self) -> str:
        lines = []
        for k, s in enumerate(self.steps):
            args = ", ".join(f"t{a.index}" if isinstance(a, Ref) else repr(a) for a in s.args)
            flags = [f for f in ("input", "output", "external") if getattr(s, f)]
            lines.append(f"  t{k} = {s.op}({args})" + (f" name={s.name!r}" if s.name else "")
                         + (f" [{' '.join(flags)}]" if flags else ""))
        lines.append(f"  roots: {list(self.roots)}")
        return "\n".join(lines)


@dataclass
class Placement:
    """Where one allocator put one graph's tensors."""

    ok: bool
    buffer_size: int
    offsets: dict = field(default_factory=dict)  # step index -> offset from the buffer base
    nodes: list = field(default_factory=list)  # step indices in graph order
    leafs: list = field(default_factory=list)
    names: list = field(default_factory=list)  # every step's tensor name after graph building


class ProgramMismatch(AssertionError):
    pass


# --- the model ------------------------------------------------------------------------------
class ModelSide:
    """The program in `Ctx(legacy=False)`, allocated by the `ggml-head` Gallocr."""

    def __init__(self, alignment: int = ALIGNMENT):
        self.galloc = Gallocr(get_profile("ggml-head"), alignment=alignment)
        self.next_external = EXTERNAL_BASE

    def start(self):
        self.ctx = Ctx(legacy=False)
        self.tensors = []

    def step(self, step: Step):
        args = [self.tensors[a.index] if isinstance(a, Ref) else a for a in step.args]
        t = getattr(self.ctx, step.op)(*args)
        if step.name:
            self.ctx.set_name(t, step.name)
        if step.input:
            self.ctx.set_input(t)
        if step.output:
            self.ctx.set_output(t)
        if step.external:
            self.ctx.place(t, self.next_external)
            self.next_external += (t.nbytes + 4095) // 4096 * 4096
        self.tensors.append(t)
        return self.describe(t)

    def describe(self, t) -> tuple:
        vs = self.tensors.index(t.view_src) if t.view_src is not None else -1
        return (t.type, list(t.ne), list(t.nb), vs, t.view_offs)

    def finish(self, roots) -> Placement:
        index = {id(t): k for k, t in enumerate(self.tensors)}
        g = self.ctx.build_forward(*[self.tensors[r] for r in roots])
        ok = self.galloc.alloc_graph(g)
        offsets = {}
        for k, t in enumerate(self.tensors):
            if t in self.galloc.placement:
                chunk, off = self.galloc.placement[t]
                offsets[k] = off if chunk == 0 else (chunk, off)
        return Placement(ok, self.galloc.buffer_size, offsets, [index[id(t)] for t in g.nodes],
                         [index[id(t)] for t in g.leafs], [t.name for t in self.tensors])


# --- real ggml ------------------------------------------------------------------------------
_BACKEND = None


def cpu_buffer_type():
    """The CPU backend must exist before its buffer type is asked for."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = ggml.ggml_backend_cpu_init()
        if not _BACKEND:
            raise RuntimeError("ggml_backend_cpu_init failed")
    return ggml.ggml_backend_get_default_buffer_type(_BACKEND)


class RealSide:
    """The program in real ggml: weights in a context with memory, the rest in a no_alloc one."""

    def __init__(self):
        self.galloc = ggml.ggml_gallocr_new(cpu_buffer_type())
        self.contexts = []  # kept alive until close(): the gallocr may still read old tensors

    def start(self, program: Program):
        n = len(program.steps) + 8
        self.graph_size = max(64, 2 * n)
        weights = sum(_nbytes_of_new(s) + 256 for s in program.steps if s.external)
        self.wctx = ggml.ggml_init(ggml.ggml_init_params(
            mem_size=ggml.ggml_tensor_overhead() * n + weights + 4096, mem_buffer=None, no_alloc=False))
        self.ctx = ggml.ggml_init(ggml.ggml_init_params(
            mem_size=ggml.ggml_tensor_overhead() * n + ggml.ggml_graph_overhead_custom(self.graph_size, False),
            mem_buffer=None, no_alloc=True))
        self.contexts += [self.wctx, self.ctx]
        self.tensors = []
        self.addr_to_index = {}

    def step(self, step: Step):
        args = []
        for a in step.args:
            if isinstance(a, Ref):
                args.append(self.tensors[a.index])
            elif isinstance(a, str):
                args.append(GGML_TYPES[a])
            else:
                args.append(a)
        fn = getattr(ggml, "ggml_" + step.op)
        t = fn(self.wctx if step.external else self.ctx, *args)
        if step.name:
            ggml.ggml_set_name(t, step.name.encode())
        if step.input:
            ggml.ggml_set_input(t)
        if step.output:
            ggml.ggml_set_output(t)
        self.addr_to_index[ctypes.addressof(t.contents)] = len(self.tensors)
        self.tensors.append(t)
        return self.describe(t)

    def describe(self, t) -> tuple:
        c = t.contents
        vs = self.addr_to_index[ctypes.addressof(c.view_src.contents)] if c.view_src else -1
        return (TYPE_NAMES[c.type], list(c.ne), list(c.nb), vs, c.view_offs)

    def finish(self, roots) -> Placement:
        gf = ggml.ggml_new_graph_custom(self.ctx, self.graph_size, False)
        for r in roots:
            ggml.ggml_build_forward_expand(gf, self.tensors[r])
        g = gf.contents
        nodes = [self.addr_to_index[ctypes.addressof(g.nodes[i].contents)] for i in range(g.n_nodes)]
        leafs = [self.addr_to_index[ctypes.addressof(g.leafs[i].contents)] for i in range(g.n_leafs)]
        ok = bool(ggml.ggml_gallocr_alloc_graph(self.galloc, gf))
        offsets, buffers = {}, set()
        for k, t in enumerate(self.tensors):
            c = t.contents
            if c.buffer and c.data:  # only the gallocr's buffer: weights live in a plain context
                buffers.add(c.buffer)
                offsets[k] = c.data - ggml.ggml_backend_buffer_get_base(c.buffer)
        if len(buffers) > 1:
            raise RuntimeError("tensors in more than one backend buffer: expected a single chunk")
        size = ggml.ggml_gallocr_get_buffer_size(self.galloc, 0)
        names = [ggml.ggml_get_name(t).decode() for t in self.tensors]
        return Placement(ok, size, offsets, nodes, leafs, names)

    def close(self):
        ggml.ggml_gallocr_free(self.galloc)
        for c in self.contexts:
            ggml.ggml_free(c)
        self.contexts = []


def _nbytes_of_new(step: Step) -> int:
    n = 1
    for d in step.args[1:]:
        n *= d
    return n * TYPE_SIZE[step.args[0]]


# --- both -------------------------------------------------------------------------------------
def run_both(programs) -> tuple[list[Placement], list[Placement]]:
    """Build each program in both, checking every tensor as it is made, then allocate the graphs
    in order with one allocator per side (as an application re-running graphs does)."""
    model, real = ModelSide(), RealSide()
    ours, theirs = [], []
    try:
        for g, program in enumerate(programs):
            model.start()
            real.start(program)
            for k, step in enumerate(program.steps):
                m = model.step(step)
                r = real.step(step)
                if m != r:
                    raise ProgramMismatch(f"graph {g} step t{k} {step.op}: model (type, ne, nb, view_src, "
                                          f"view_offs) {m} != ggml {r}\n{program.describe()}")
            ours.append(model.finish(program.roots))
            theirs.append(real.finish(program.roots))
    finally:
        real.close()
    return ours, theirs


# --- a real ggml graph, read back as the model's tensors ----------------------------------------
def _addr(p) -> int:
    return ctypes.cast(p, ctypes.c_void_p).value or 0


def read_graph(gf):
    """The model's Graph for a built ggml graph, read tensor by tensor as the recorder reads one
    (traces/sources/record/plans.py: build_graph), and `by_addr`: tensor address -> model Tensor."""
    from alloctrace.traces.sources.record.plans import build_graph
    from alloctrace.traces.sources.record.stream import Call, TensorRec

    g = gf.contents
    nodes = [g.nodes[i] for i in range(g.n_nodes)]
    leafs = [g.leafs[i] for i in range(g.n_leafs)]
    recs, seen = [], set()

    def add(kind, t):
        a = _addr(t)
        if not a or a in seen:
            return
        seen.add(a)
        c = t.contents
        srcs = [_addr(c.src[i]) for i in range(ggml.GGML_MAX_SRC)]
        while srcs and not srcs[-1]:
            srcs.pop()
        recs.append(TensorRec(
            kind=kind, ptr=a, type=ggml.ggml_type_name(c.type).decode(), op=ggml.ggml_op_name(c.op).decode(),
            desc=ggml.ggml_op_desc(t).decode(), flags=c.flags, ne=tuple(c.ne), nb=tuple(c.nb),
            nbytes=ggml.ggml_nbytes(t), data=c.data or 0, buffer=_addr(c.buffer), view_src=_addr(c.view_src),
            view_offs=c.view_offs, srcs=srcs, alloc_sizes=(), name=ggml.ggml_get_name(t).decode()))

    for t in nodes:
        add("n", t)
    for t in leafs:
        add("l", t)
    todo = list(nodes) + list(leafs)
    while todo:  # tensors the graph points at that are in neither list (a view's source)
        c = todo.pop().contents
        for p in [c.src[i] for i in range(ggml.GGML_MAX_SRC)] + [c.view_src]:
            if _addr(p) and _addr(p) not in seen:
                add("x", p)
                todo.append(p)
    call = Call(seq=0, kind="alloc_graph", obj=0, graph=_addr(gf), parent=0, n_nodes=len(nodes),
                n_leafs=len(leafs), tensors=recs)
    return build_graph(call)
