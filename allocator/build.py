"""Build graphs the way ggml's API does: same shapes, strides, names, sources and node order.

`Ctx` mirrors the ggml functions graph code calls (`ggml_add` -> `ctx.add`),
with the sources and names of either the 2023 API (`legacy=True`) or the
current one. Presets and the differential tests drive it; nothing here
allocates memory except `place`, which sets a tensor's address as ggml would
for a tensor living in another buffer.
"""
from __future__ import annotations

from .tensor import TYPE_SIZE, Graph, Tensor, contiguous_nb, nbytes_2023

_UNARY = {"gelu": "GELU", "silu": "SILU", "relu": "RELU", "tanh": "TANH", "gelu_quick": "GELU_QUICK"}


class Ctx:
    """A no_alloc ggml context: tensors are created without memory."""

    def __init__(self, legacy: bool = False):
        self.legacy = legacy
        self.tensors: list[Tensor] = []

    # --- tensors ----------------------------------------------------------------------
    def _new(self, type_, ne, op="NONE", srcs=(), name="", nb=(), view_of: Tensor | None = None, offs=0,
             op_desc=""):
        t = Tensor(name=name, op=op, type=type_, ne=tuple(ne), nb=tuple(nb), srcs=list(srcs), op_desc=op_desc)
        if self.legacy:
            t.nbytes = nbytes_2023(t.type, t.ne, t.nb)
        if view_of is not None:
            src = view_of.view_src if view_of.view_src is not None else view_of
            t.view_src = src
            t.view_offs = (view_of.view_offs if view_of.view_src is not None else 0) + offs
            if src.data:  # a view of a placed tensor has its address from the start
                t.data = src.data + t.view_offs
        self.tensors.append(t)
        return t

    def new_tensor(self, type_: str, ne) -> Tensor:
        return self._new(type_, ne)

    def new_tensor_1d(self, type_, ne0):
        return self._new(type_, (ne0,))

    def new_tensor_2d(self, type_, ne0, ne1):
        return self._new(type_, (ne0, ne1))

    def new_tensor_3d(self, type_, ne0, ne1, ne2):
        return self._new(type_, (ne0, ne1, ne2))

    def new_tensor_4d(self, type_, ne0, ne1, ne2, ne3):
        return self._new(type_, (ne0, ne1, ne2, ne3))

    def dup_tensor(self, a: Tensor) -> Tensor:
        return self._new(a.type, a.ne)

    @staticmethod
    def set_name(t: Tensor, name: str) -> Tensor:
        t.name = name[:63]
        return t

    @staticmethod
    def set_input(t: Tensor) -> Tensor:
        t.input = True
        return t

    @staticmethod
    def set_output(t: Tensor) -> Tensor:
        t.output = True
        return t

    @staticmethod
    def set_param(t: Tensor) -> Tensor:
        t.param = True
        return t

    @staticmethod
    def place(t: Tensor, addr: int) -> Tensor:
        """Give a tensor memory outside the graph allocator (weights, KV cache, inputs)."""
        t.data = addr
        return t

    # --- elementwise and friends: the result is a fresh tensor shaped like `a` ----------
    def _like(self, op, a, srcs, op_desc=""):
        return self._new(a.type, a.ne, op=op, srcs=srcs, op_desc=op_desc)

    def add(self, a, b):
        return self._like("ADD", a, [a, b])

    def sub(self, a, b):
        return self._like("SUB", a, [a, b])

    def mul(self, a, b):
        return self._like("MUL", a, [a, b])

    def div(self, a, b):
        return self._like("DIV", a, [a, b])

    def sqr(self, a):
        return self._like("SQR", a, [a])

    def scale(self, a, s):
        """2023: the factor is a tensor source; later a float parameter."""
        return self._like("SCALE", a, [a, s] if isinstance(s, Tensor) else [a])

    def norm(self, a, eps=1e-5):
        return self._like("NORM", a, [a])

    def rms_norm(self, a, eps=1e-6):
        return self._like("RMS_NORM", a, [a])

    def soft_max(self, a):
        return self._like("SOFT_MAX", a, [a])

    def diag_mask_inf(self, a, n_past=0):
        return self._like("DIAG_MASK_INF", a, [a])

    def rope(self, a, pos_or_n_past=None, n_dims=0, mode=0):
        """2023: n_past is a parameter; later the positions are a tensor source."""
        srcs = [a, pos_or_n_past] if isinstance(pos_or_n_past, Tensor) else [a]
        return self._like("ROPE", a, srcs)

    # --- 2023 inplace ops: ggml_view_tensor(a) made the result, so it has a's strides and is named
    #     "<a> (view)"; with no_alloc its data was NULL, and the allocator treated it as any other node
    def _inplace(self, op, a, srcs):
        t = self._new(a.type, a.ne, op=op, srcs=srcs, nb=a.nb)
        t.name = f"{a.name} (view)"
        return t

    def rope_custom_inplace(self, a, n_past=0, n_dims=0, mode=0, n_ctx=0, freq_base=10000.0, freq_scale=1.0):
        """ggml_rope_custom_inplace (Aug 2023): n_past and the mode are parameters, not sources."""
        return self._inplace("ROPE", a, [a])

    def scale_inplace(self, a, s):
        return self._inplace("SCALE", a, [a, s] if isinstance(s, Tensor) else [a])

    def diag_mask_inf_inplace(self, a, n_past=0):
        return self._inplace("DIAG_MASK_INF", a, [a])

    def soft_max_inplace(self, a):
        return self._inplace("SOFT_MAX", a, [a])

    def unary(self, a, kind: str):
        return self._like("UNARY", a, [a], op_desc=_UNARY[kind])

    def gelu(self, a):
        return self.unary(a, "gelu")

    def silu(self, a):
        return self.unary(a, "silu")

    def relu(self, a):
        return self.unary(a, "relu")

    def cont(self, a):
        t = self._new(a.type, a.ne, op="CONT", srcs=[a])
        t.name = f"{a.name} (cont)"
        return t

    # --- shape-changing compute ops ---------------------------------------------------
    def mul_mat(self, a, b):
        return self._new("f32", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), op="MUL_MAT", srcs=[a, b])

    def get_rows(self, a, b):
        type_ = "i32" if a.type == "i32" and not self.legacy else "f32"  # later ggml keeps i32 rows i32
        return self._new(type_, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), op="GET_ROWS", srcs=[a, b])

    def repeat(self, a, b):
        """The result has b's shape; 2023 kept b as a source, later only its shape."""
        return self._new(a.type, b.ne, op="REPEAT", srcs=[a, b] if self.legacy else [a])

    # --- views --------------------------------------------------------------------------
    def cpy(self, a, b):
        t = self._new(b.type, b.ne, op="CPY", srcs=[a, b], nb=b.nb, view_of=b)
        t.name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
        return t

    def _view(self, a, ne, nb, offset):
        t = self._new(a.type, ne, op="VIEW", srcs=[a], nb=nb, view_of=a, offs=offset)
        t.op_offset = offset
        t.name = f"{a.name} (view)"
        return t

    def view_1d(self, a, ne0, offset):
        return self._view(a, (ne0,), contiguous_nb(a.type, (ne0, 1, 1, 1)), offset)

    # a view's row stride nb[0] is its type's size even when `a` is transposed or permuted
    def view_2d(self, a, ne0, ne1, nb1, offset):
        ts = TYPE_SIZE[a.type]
        return self._view(a, (ne0, ne1), (ts, nb1, nb1 * ne1, nb1 * ne1), offset)

    def view_3d(self, a, ne0, ne1, ne2, nb1, nb2, offset):
        ts = TYPE_SIZE[a.type]
        return self._view(a, (ne0, ne1, ne2), (ts, nb1, nb2, nb2 * ne2), offset)

    def view_4d(self, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset):
        return self._view(a, (ne0, ne1, ne2, ne3), (TYPE_SIZE[a.type], nb1, nb2, nb3), offset)

    def reshape(self, a, ne):
        t = self._new(a.type, tuple(ne), op="RESHAPE", srcs=[a], view_of=a)
        t.name = f"{a.name} (reshaped)"
        return t

    def reshape_1d(self, a, ne0):
        return self.reshape(a, (ne0,))

    def reshape_2d(self, a, ne0, ne1):
        return self.reshape(a, (ne0, ne1))

    def reshape_3d(self, a, ne0, ne1, ne2):
        return self.reshape(a, (ne0, ne1, ne2))

    def reshape_4d(self, a, ne0, ne1, ne2, ne3):
        return self.reshape(a, (ne0, ne1, ne2, ne3))

    def permute(self, a, ax0, ax1, ax2, ax3):
        ne, nb = [0] * 4, [0] * 4
        for i, ax in enumerate((ax0, ax1, ax2, ax3)):
            ne[ax], nb[ax] = a.ne[i], a.nb[i]
        t = self._new(a.type, ne, op="PERMUTE", srcs=[a], nb=nb, view_of=a)
        t.name = f"{a.name} (permuted)"
        return t

    def transpose(self, a):
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        t = self._new(a.type, ne, op="TRANSPOSE", srcs=[a], nb=nb, view_of=a)
        t.name = f"{a.name} (transposed)"
        return t

    # --- graphs -------------------------------------------------------------------------
    def build_forward(self, *outputs: Tensor, graph: Graph | None = None) -> Graph:
        """ggml_build_forward_expand for each output in turn: parents first, depth first, in
        source order; op NONE tensors (not params) become leafs; unnamed ones get leaf_N/node_N."""
        g = graph or Graph([], [])
        # programs expand one graph many times (llama: twice per layer); keep the visited set
        # with the graph instead of rebuilding it, unless the graph changed behind our back
        seen = getattr(g, "_visited", None)
        if seen is None or len(seen) != len(g.nodes) + len(g.leafs):
            seen = {id(t) for t in g.nodes} | {id(t) for t in g.leafs}
        for out in outputs:
            stack = [(out, 0)]
            while stack:
                t, i = stack.pop()
                if i == 0:
                    if id(t) in seen:
                        continue
                    seen.add(id(t))
                if i < len(t.srcs):
                    stack.append((t, i + 1))
                    s = t.srcs[i]
                    if s is not None and id(s) not in seen:
                        stack.append((s, 0))
                    continue
                if t.op == "NONE" and not t.param:
                    if not t.name:
                        t.name = f"leaf_{len(g.leafs)}"
                    t.index = len(g.leafs)
                    g.leafs.append(t)
                else:
                    if not t.name:
                        t.name = f"node_{len(g.nodes)}"
                    t.index = len(g.nodes)
                    g.nodes.append(t)
        g._visited = seen
        return g
