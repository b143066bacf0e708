"""The model places every tensor where the real ggml_gallocr (ggml-python's bundled ggml) does.

Random op programs are generated valid by construction: each op is only
applied to tensors meeting the GGML_ASSERTs of its ggml function (shapes that
broadcast, contiguity, view bounds). The generator reads shapes from the
model's builder; `realggml.run_both` checks them against ggml at every step.
"""
import math

from hypothesis import HealthCheck, example, given, settings, strategies as st

from alloctrace.allocator.build import Ctx
from alloctrace.allocator.tensor import TYPE_SIZE, nbytes_of
from realggml import Program, Ref, Step, run_both

FLOAT_TYPES = ("f32", "f16")
SETTINGS = dict(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- ggml's shape predicates, as its asserts use them -----------------------------------------
def is_contiguous(t) -> bool:
    ts = TYPE_SIZE[t.type]
    if t.ne[0] != 1 and t.nb[0] != ts:
        return False
    nxt = ts * t.ne[0]
    for i in range(1, 4):
        if t.ne[i] != 1 and t.nb[i] != nxt:
            return False
        nxt *= t.ne[i]
    return True


def is_padded_1d(t) -> bool:
    return t.nb[0] == TYPE_SIZE[t.type] and t.nb[2] == t.nb[1] * t.ne[1] and t.nb[3] == t.nb[2] * t.ne[2]


def can_repeat(a, b) -> bool:
    """b's shape is a whole multiple of a's."""
    return all(b.ne[i] % a.ne[i] == 0 for i in range(4))


def factorize(draw, n: int, ndims: int) -> list:
    dims = []
    for _ in range(ndims - 1):
        divisors = [d for d in range(1, n + 1) if n % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        n //= d
    return dims + [n]


# --- the generator ----------------------------------------------------------------------------
class ProgramBuilder:
    """Appends steps and mirrors them in a model context, to know each tensor's shape."""

    def __init__(self, draw):
        self.draw = draw
        self.ctx = Ctx(legacy=False)
        self.steps, self.tensors = [], []
        self.pool = []  # float tensors ops may use

    def emit(self, op, *args, pool=True, external=False, input=False, output=False):
        k = len(self.steps)
        name = f"t{k}" if self.draw(st.integers(0, 4)) else ""
        step = Step(op, tuple(args), name=name, external=external, input=input, output=output)
        real_args = [self.tensors[a.index] if isinstance(a, Ref) else a for a in args]
        t = getattr(self.ctx, op)(*real_args)
        self.steps.append(step)
        self.tensors.append(t)
        if pool:
            self.pool.append(k)
        return k

    def leaf(self, ne, type_=None, kind=None, pool=True):
        type_ = type_ or self.draw(st.sampled_from(FLOAT_TYPES))
        kind = kind or self.draw(st.sampled_from(["external", "external", "input", "plain"]))
        return self.emit(f"new_tensor_{len(ne)}d", type_, *ne, pool=pool, external=kind == "external",
                         input=kind == "input")

    def shape(self):
        nd = self.draw(st.integers(1, 4))
        ne = [self.draw(st.integers(1, 40))] + [self.draw(st.integers(1, 6)) for _ in range(nd - 1)]
        return ne

    def pick(self):
        """Mostly a recent tensor (chains), sometimes any (fan-out)."""
        if self.draw(st.booleans()):
            return self.pool[-1 - self.draw(st.integers(0, min(2, len(self.pool) - 1)))]
        return self.draw(st.sampled_from(self.pool))

    def t(self, k):
        return self.tensors[k]

    def flags(self):
        return dict(output=self.draw(st.integers(0, 9)) == 9, input=self.draw(st.integers(0, 29)) == 29)

    # each op returns the new step index, or None when `a` does not suit it
    def binary(self, op, a):
        ta = self.t(a)
        choice = self.draw(st.sampled_from(["self", "pool", "leaf"]))
        if choice == "self":
            b = a
        elif choice == "pool" and any(can_repeat(self.t(k), ta) for k in self.pool):
            b = self.draw(st.sampled_from([k for k in self.pool if can_repeat(self.t(k), ta)]))
        else:
            ne = [n if self.draw(st.booleans()) else 1 for n in ta.ne]
            b = self.leaf(ne)
        return self.emit(op, Ref(a), Ref(b), **self.flags())

    def unary(self, op, a):
        ta = self.t(a)
        if op in ("gelu", "silu") and not (ta.ne[0] == 1 or ta.nb[0] == TYPE_SIZE[ta.type]):
            return None
        if op == "soft_max" and not is_contiguous(ta):
            return None
        if op == "scale":
            if not is_padded_1d(ta):
                return None
            return self.emit("scale", Ref(a), self.draw(st.sampled_from([0.5, 0.125, 2.0])), **self.flags())
        if op in ("norm", "rms_norm"):
            return self.emit(op, Ref(a), 1e-5, **self.flags())
        if op == "diag_mask_inf":
            return self.emit(op, Ref(a), self.draw(st.integers(0, 2)), **self.flags())
        return self.emit(op, Ref(a), **self.flags())

    def rope(self, a):
        ta = self.t(a)
        pos = self.leaf([ta.ne[2]], "i32", self.draw(st.sampled_from(["input", "external"])), pool=False)
        return self.emit("rope", Ref(a), Ref(pos), ta.ne[0] - ta.ne[0] % 2, 0, **self.flags())

    def mul_mat(self, a):
        ta = self.t(a)
        if self.draw(st.booleans()):  # a weight times the activation a
            ne = [ta.ne[0], self.draw(st.integers(1, 24)),
                  self.draw(st.sampled_from([d for d in range(1, ta.ne[2] + 1) if ta.ne[2] % d == 0])), 1]
            w = self.leaf(ne, kind="external")
            return self.emit("mul_mat", Ref(w), Ref(a), **self.flags())
        if ta.nb[0] > ta.nb[1]:  # ggml_is_transposed(a)
            return None
        ne = [ta.ne[0], self.draw(st.integers(1, 8)), ta.ne[2] * self.draw(st.integers(1, 2)), ta.ne[3]]
        b = self.leaf(ne)
        return self.emit("mul_mat", Ref(a), Ref(b), **self.flags())

    def get_rows(self, a):
        ta = self.t(a)
        rows = self.leaf([self.draw(st.integers(1, 6)), ta.ne[2], ta.ne[3]], "i32",
                         self.draw(st.sampled_from(["input", "plain"])), pool=False)
        return self.emit("get_rows", Ref(a), Ref(rows), **self.flags())

    def repeat(self, a):
        ta = self.t(a)
        ne = [n * self.draw(st.integers(1, 3)) for n in ta.ne]
        b = self.leaf(ne, kind=self.draw(st.sampled_from(["external", "plain"])), pool=False)
        return self.emit("repeat", Ref(a), Ref(b), **self.flags())

    def reshape(self, a):
        ta = self.t(a)
        if not is_contiguous(ta):
            return None
        nd = self.draw(st.integers(1, 4))
        ne = factorize(self.draw, math.prod(ta.ne), nd)
        return self.emit(f"reshape_{nd}d", Ref(a), *ne, **self.flags())

    def permute(self, a):
        axes = self.draw(st.permutations([0, 1, 2, 3]))
        return self.emit("permute", Ref(a), *axes, **self.flags())

    def view(self, a):
        """A view whose data fits its root tensor, as ggml_new_tensor_impl asserts."""
        ta = self.t(a)
        root = ta.view_src if ta.view_src is not None else ta
        ts = TYPE_SIZE[ta.type]
        cap = (nbytes_of(root.type, root.ne, root.nb) - ta.view_offs) // ts  # elements that still fit
        if cap < 1:
            return None
        nd = self.draw(st.integers(1, 3))
        ne = [self.draw(st.integers(1, min(cap, 48)))]
        for _ in range(nd - 1):
            ne.append(self.draw(st.integers(1, max(1, cap // math.prod(ne)))))
        if math.prod(ne) > cap:
            ne = [1] * nd
        off = ts * self.draw(st.integers(0, cap - math.prod(ne)))
        if nd == 1:
            return self.emit("view_1d", Ref(a), ne[0], off, **self.flags())
        nb1 = self.draw(st.sampled_from([ts * ne[0], ta.nb[1]]))
        if nd == 2:
            return self.emit("view_2d", Ref(a), ne[0], ne[1], nb1, off, **self.flags())
        return self.emit("view_3d", Ref(a), ne[0], ne[1], ne[2], nb1, nb1 * ne[1], off, **self.flags())

    def cpy(self, a):
        ta = self.t(a)
        n = math.prod(ta.ne)
        dst = self.draw(st.sampled_from(["external", "plain", "cache_view", "graph_view"]))
        type_ = self.draw(st.sampled_from(FLOAT_TYPES))
        if dst == "graph_view":
            fits = [k for k in self.pool if self.t(k).view_src is None and self.t(k).type == type_
                    and math.prod(self.t(k).ne) >= n]
            if not fits:
                dst = "cache_view"
        if dst == "cache_view":
            extra = self.draw(st.integers(0, 16))
            cache = self.leaf([n + extra], type_, "external", pool=False)
            b = self.emit("view_1d", Ref(cache), n, TYPE_SIZE[type_] * self.draw(st.integers(0, extra)), pool=False)
        elif dst == "graph_view":
            x = self.draw(st.sampled_from(fits))
            b = self.emit("view_1d", Ref(x), n, 0, pool=False)
        else:
            b = self.leaf(factorize(self.draw, n, self.draw(st.integers(1, 3))), type_, dst, pool=False)
        return self.emit("cpy", Ref(a), Ref(b), **self.flags())

    def op(self):
        kind = self.draw(st.sampled_from([
            "add", "add", "mul", "sub", "div", "gelu", "silu", "scale", "norm", "rms_norm", "soft_max",
            "diag_mask_inf", "cont", "rope", "mul_mat", "mul_mat", "get_rows", "repeat", "reshape",
            "permute", "transpose", "view", "view", "cpy"]))
        a = self.pick()
        if kind in ("add", "mul", "sub", "div"):
            r = self.binary(kind, a)
        elif kind in ("gelu", "silu", "scale", "norm", "rms_norm", "soft_max", "diag_mask_inf", "cont",
                      "transpose"):
            r = self.unary(kind, a)
        else:
            r = getattr(self, kind)(a)
        if r is None:
            r = self.emit("cont", Ref(a), **self.flags())
        return r


@st.composite
def programs(draw, max_ops=24):
    b = ProgramBuilder(draw)
    for _ in range(draw(st.integers(1, 3))):
        b.leaf(b.shape())
    last = None
    for _ in range(draw(st.integers(1, max_ops))):
        last = b.op()
    # roots are op results: a leaf reachable only as a root is never checked by ggml's plan-reuse test,
    # and real ggml crashes when such a leaf moves from a weight buffer into its own (see flip_externals)
    ops = [k for k in b.pool if not b.steps[k].op.startswith("new_tensor")]
    extra = draw(st.lists(st.sampled_from(ops), max_size=3, unique=True))
    roots = draw(st.permutations(list(dict.fromkeys([last] + extra))))
    return Program(tuple(b.steps), tuple(roots))


def flip_externals(draw, program: Program) -> Program:
    """The same graph with some leafs moved between weights and the allocator's buffer."""
    steps = list(program.steps)
    for k, s in enumerate(steps):
        if s.op.startswith("new_tensor") and draw(st.integers(0, 2)) == 0:
            steps[k] = Step(s.op, s.args, s.name, input=s.input, output=s.output, external=not s.external)
    return Program(tuple(steps), program.roots)


@st.composite
def graph_sequences(draw):
    a = draw(programs())
    seq = [a]
    for _ in range(draw(st.integers(1, 2))):
        how = draw(st.sampled_from(["same", "flipped", "other"]))
        seq.append(a if how == "same" else flip_externals(draw, a) if how == "flipped" else draw(programs()))
    return seq


# --- the comparisons ---------------------------------------------------------------------------
def assert_same_allocation(programs_, ours, theirs):
    for g, (program, o, t) in enumerate(zip(programs_, ours, theirs)):
        where = f"graph {g} of {len(programs_)}:\n{program.describe()}"
        assert o.names == t.names, where
        assert (o.nodes, o.leafs) == (t.nodes, t.leafs), f"graph order differs, {where}"
        assert o.ok == t.ok, where
        assert o.offsets == t.offsets, f"offsets (step -> offset) model {o.offsets} != ggml {t.offsets}, {where}"
        assert o.buffer_size == t.buffer_size, f"buffer size model {o.buffer_size} != ggml {t.buffer_size}, {where}"


# found by this test: a view of a transposed tensor has nb[0] = type size, not the source's nb[0]
VIEW_OF_TRANSPOSED = Program((
    Step("new_tensor_2d", ("f32", 4, 3), "x", input=True),
    Step("transpose", (Ref(0),)),
    Step("view_2d", (Ref(1), 2, 2, 16, 0)),
    Step("cont", (Ref(2),), output=True),
), (3,))


@settings(**SETTINGS)
@example(VIEW_OF_TRANSPOSED)
@given(programs())
def test_single_graph_offsets_and_buffer_size_match_ggml(program):
    ours, theirs = run_both([program])
    assert_same_allocation([program], ours, theirs)


@settings(**dict(SETTINGS, max_examples=40))
@given(programs(max_ops=90))
def test_long_programs_fragment_and_reuse_like_ggml(program):
    """Longer programs leave more free blocks behind, which is where best-fit choices differ."""
    ours, theirs = run_both([program])
    assert_same_allocation([program], ours, theirs)


@settings(**dict(SETTINGS, max_examples=60))
@given(graph_sequences())
def test_graph_sequence_replans_like_ggml(seq):
    ours, theirs = run_both(seq)
    assert_same_allocation(seq, ours, theirs)


def test_a_bigger_second_graph_grows_the_buffer_like_ggml():
    """A fixed case: a chain, then the same chain on a longer input; the plan is redone and the
    buffer grows; then the short one again reuses the bigger buffer."""
    def chain(n_tokens):
        steps = [Step("new_tensor_2d", ("f32", 64, 64), "w", external=True),
                 Step("new_tensor_2d", ("f32", 64, n_tokens), "x", input=True),
                 Step("mul_mat", (Ref(0), Ref(1)), "h"),
                 Step("gelu", (Ref(2),), "g"),
                 Step("add", (Ref(3), Ref(1)), "r"),
                 Step("scale", (Ref(4), 0.5), "out", output=True)]
        return Program(tuple(steps), (5,))
    seq = [chain(3), chain(17), chain(3)]
    ours, theirs = run_both(seq)
    assert_same_allocation(seq, ours, theirs)
    sizes = [t.buffer_size for t in theirs]
    assert sizes[1] > sizes[0] and sizes[2] == sizes[1]


def test_plan_reuse_checks_a_source_the_planned_node_did_not_have():
    """Found by this test: same node and leaf counts, but the node now has a second source. ggml checks
    it against the empty slot of the plan: a weight fits (plan reused), an input does not (re-plan)."""
    def graph(op, external):
        steps = (Step("new_tensor_1d", ("f32", 8), "w", external=external, input=not external),
                 Step(op, (Ref(0),) * (2 if op == "add" else 1), "y"))
        return Program(steps, (1,))
    for second in (graph("add", True), graph("add", False)):
        seq = [graph("gelu", True), second]
        ours, theirs = run_both(seq)
        assert_same_allocation(seq, ours, theirs)
