"""Tensors and graphs as ggml sees them, reduced to what the allocator reads.

Addresses are plain integers and 0 is NULL, as in C: ggml's own tests compare
pointers (`parent->data < alloc->data`) and do arithmetic on NULL
(`NULL + offset`), and a faithful model has to do the same.
"""
from __future__ import annotations

from .record_class import record_class, field

# bytes per element (block size 1 types only: what graph allocators see in practice)
TYPE_SIZE = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i16": 2, "i8": 1, "i64": 8, "f64": 8}

# 2023 view ops: the result shares its parent's memory (CPY shares its destination, src[1])
VIEW_OPS_2023 = frozenset({"RESHAPE", "VIEW", "TRANSPOSE", "PERMUTE", "CPY"})


@record_class(eq=False, slots=True)
class Tensor:
    """One ggml tensor. Identity is the object, as a `struct ggml_tensor *` is."""

    name: str
    op: str = "NONE"
    type: str = "f32"
    ne: tuple = (1, 1, 1, 1)
    nb: tuple = ()
    nbytes: int = 0
    srcs: list = field(default_factory=list)  # Tensor or None per src slot
    view_src: "Tensor | None" = None  # the first non-view tensor whose memory this one uses
    view_offs: int = 0  # byte offset into view_src
    op_offset: int = 0  # a VIEW op's own offset parameter, relative to srcs[0]
    input: bool = False
    output: bool = False
    param: bool = False
    data: int = 0  # address; non-zero before allocation means "allocated elsewhere"
    buffer: int = 0  # a backend buffer the tensor is on before allocation (also "not the allocator's")
    op_desc: str = ""  # ggml_op_desc: GELU for UNARY(GELU) and so on
    index: int = -1  # position in its graph's nodes or leafs

    def __post_init__(self):
        self.ne = tuple(self.ne) + (1,) * (4 - len(self.ne))
        if not self.nb:
            self.nb = contiguous_nb(self.type, self.ne)
        else:
            self.nb = tuple(self.nb)
        if not self.nbytes:
            self.nbytes = nbytes_of(self.type, self.ne, self.nb)
        if not self.op_desc:
            self.op_desc = self.op

    @property
    def src_names(self) -> list:
        return [s.name if s is not None else None for s in self.srcs]

    def __repr__(self):
        return f"Tensor({self.name!r}, {self.op}, {self.type}{list(self.ne)})"


def contiguous_nb(type_: str, ne) -> tuple:
    ts = TYPE_SIZE[type_]
    nb = [ts]
    for i in range(1, 4):
        nb.append(nb[i - 1] * ne[i - 1])
    return tuple(nb)


def nbytes_of(type_: str, ne, nb) -> int:
    """ggml_nbytes for block-size-1 types: last byte of the last element, plus one element."""
    if any(n <= 0 for n in ne):
        return 0
    size = TYPE_SIZE[type_]
    for i in range(4):
        size += (ne[i] - 1) * nb[i]
    return size


def nbytes_2023(type_: str, ne, nb) -> int:
    """ggml_nbytes as of Aug 2023: max(ne[3]*nb[3], nelements*type size)."""
    n = ne[0] * ne[1] * ne[2] * ne[3]
    return max(ne[3] * nb[3], n * TYPE_SIZE[type_])


def same_layout(a: Tensor, b: Tensor) -> bool:
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


@record_class(eq=False)
class Graph:
    """A ggml_cgraph: nodes in execution order, then leafs (tensors with op NONE)."""

    nodes: list
    leafs: list = field(default_factory=list)
    name: str = ""

    def __post_init__(self):
        for i, t in enumerate(self.nodes):
            t.index = i
        for i, t in enumerate(self.leafs):
            t.index = i

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def tensors(self):
        return list(self.leafs) + list(self.nodes)

    def by_name(self, name: str) -> Tensor:
        for t in self.tensors():
            if t.name == name:
                return t
        raise KeyError(name)
