"""Numeric execution of plans on one byte arena, compared with private-memory execution."""
import numpy as np
import pytest

from alloctrace.allocator.tensor import Tensor
from alloctrace.metal_exec.execute import Memory, level_order, reference_run, run
from alloctrace.metal_exec.hazards import check
from alloctrace.metal_exec.kernels import compute, shape_of
from alloctrace.metal_exec.plan import read_srcs

from test_hazards import CLEAN, GENEROUS, HEAD, PARSESEQ, PLAIN, live_pairs, plans_for


@pytest.mark.parametrize("buffer_size", [None, GENEROUS])
@pytest.mark.parametrize("name,profile,parse_seq", CLEAN)
def test_clean_plans_compute_what_private_memory_computes(fixtures, name, profile, parse_seq, buffer_size):
    for plan in plans_for(fixtures, name, profile, parse_seq, buffer_size=buffer_size):
        for order in ("adversarial", "shuffled"):
            result = run(plan, order=order, seed=3)
            assert result.ok, (order, result.first, result.mismatched)
            assert sorted(result.order) == list(range(plan.graph.n_nodes))


def test_the_reference_is_not_trivial(fixtures):
    g = plans_for(fixtures, PLAIN, "ggml-2023-08-28")[0].graph
    ref = reference_run(g, seed=1)
    soft = ref.outputs[g.by_name("KQ_soft_max")]
    assert np.allclose(soft.sum(axis=-1), 1.0, atol=1e-5)
    assert np.all(soft[..., 0, 1:] == 0)  # row 0 sees only position 0 after the causal mask
    result = ref.outputs[g.by_name("result")]
    assert np.isfinite(result).all() and np.abs(result).max() > 0


def test_concurrent_level_race_corrupts_the_numeric_run(fixtures):
    plan = plans_for(fixtures, PARSESEQ, "ggml-2023-08-16", True, buffer_size=GENEROUS)[0]
    hazards = check(plan)
    result = run(plan, order="adversarial")
    assert not result.ok and result.first is not None
    first = result.first
    # the numeric run blames what the static check found: same victim, same writer
    assert any(h.parent == first.tensor and h.tensor == first.overwriter and h.extra["other"] == first.reader
               for h in hazards)
    assert first.max_abs_diff > 0 and first.reader in result.mismatched


def test_the_race_depends_on_dispatch_order(fixtures):
    """Listed order happens to run the writer last; the adversarial order runs it first."""
    plan = plans_for(fixtures, PARSESEQ, "ggml-2023-08-16", True, buffer_size=GENEROUS)[0]
    h = check(plan)[0]
    level = plan.steps()[h.extra["step"]]
    writer = plan.graph.by_name(h.tensor).index
    reader = plan.graph.by_name(h.extra["other"]).index
    adv = level_order(plan, level, "adversarial", np.random.default_rng(0))
    assert adv.index(writer) < adv.index(reader)
    assert level.index(writer) > level.index(reader)  # parse_seq lists the writer after its victim's reader
    assert run(plan, order="graph").ok


@pytest.mark.parametrize("name,profile", [(PLAIN, "ggml-2023-08-28"), (HEAD, "ggml-head")])
def test_a_tensor_moved_onto_a_live_one_corrupts_its_reader(fixtures, name, profile):
    plan = plans_for(fixtures, name, profile)[0]
    t, victim = next(live_pairs(plan))
    result = run(plan.moved(t, plan.range(victim)[0]))
    assert not result.ok
    assert (result.first.tensor, result.first.overwriter) == (victim.name, t.name)
    readers = [n.name for n in plan.graph.nodes if victim in read_srcs(n)]
    assert result.first.reader in readers


def test_lost_output_shows_at_the_end(fixtures):
    """2023 walks reuse the head harness's output attn_o inplace: the program would read a wrong value."""
    plan = plans_for(fixtures, HEAD, "ggml-2023-08-28")[0]
    result = run(plan)
    assert result.first.tensor == "attn_o" and result.first.reader == "<graph output>"
    assert result.first.overwriter == check(plan)[0].tensor


def test_views_in_the_arena_alias_their_source(fixtures):
    plan = plans_for(fixtures, PLAIN, "ggml-2023-08-28")[0]
    mem = Memory(plan.graph, plan)
    qk_b, kcur = plan.graph.by_name("qk_b"), plan.graph.by_name("Kcur")
    mem.store(qk_b, np.arange(np.prod(shape_of(qk_b)), dtype=np.float32).reshape(shape_of(qk_b)))
    # Kcur is the second half of every qk_b row (view offset 256 bytes = 64 floats)
    assert np.array_equal(mem.load(kcur), mem.load(qk_b)[..., 64:])


def test_chain_graph_runs_serially():
    from test_hazards import chain_plan
    plan = chain_plan(3)
    assert run(plan).ok
    ref = reference_run(plan.graph)
    act = ref.outputs[plan.graph.by_name("act0")]
    pre = ref.outputs[plan.graph.by_name("add0")]
    assert np.allclose(act, pre / (1 + np.exp(-pre)), atol=1e-6)  # the op_desc picked SILU


# --- kernels against real ggml (ggml-python) -------------------------------------------------------
ggml = pytest.importorskip("ggml")
import ggml.utils  # noqa: E402


@pytest.fixture
def ctx():
    c = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 * 1024 * 1024, mem_buffer=None))
    yield c
    ggml.ggml_free(c)


def _ggml_tensor(ctx, arr):
    ne = list(reversed(arr.shape)) + [1] * (4 - arr.ndim)
    typ = ggml.GGML_TYPE_I32 if arr.dtype == np.int32 else ggml.GGML_TYPE_F32
    t = ggml.ggml_new_tensor_4d(ctx, typ, *ne)
    ggml.utils.to_numpy(t)[...] = arr.reshape(ggml.utils.to_numpy(t).shape)
    return t


def _ggml_eval(ctx, out):
    g = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(g, out)
    ggml.ggml_graph_compute_with_ctx(ctx, g, 1)
    return np.array(ggml.utils.to_numpy(out)).reshape(
        tuple(reversed([out.contents.ne[i] for i in range(4)])))


def _as4(a):
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


RNG = np.random.default_rng(11)


def test_mul_mat_matches_ggml(ctx):
    a = RNG.standard_normal((3, 5, 16)).astype(np.float32)  # ne (16, 5, 3)
    b = RNG.standard_normal((3, 7, 16)).astype(np.float32)  # ne (16, 7, 3)
    want = _ggml_eval(ctx, ggml.ggml_mul_mat(ctx, _ggml_tensor(ctx, a), _ggml_tensor(ctx, b)))
    got = compute(Tensor("n", "MUL_MAT", ne=(5, 7, 3)), [_as4(a), _as4(b)])
    assert np.allclose(got, want, atol=1e-4)


@pytest.mark.parametrize("op", ["NORM", "RMS_NORM", "SOFT_MAX", "GELU", "SILU"])
def test_row_ops_match_ggml(ctx, op):
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    t = _ggml_tensor(ctx, x)
    fn = {"NORM": lambda: ggml.ggml_norm(ctx, t, 1e-5), "RMS_NORM": lambda: ggml.ggml_rms_norm(ctx, t, 1e-5),
          "SOFT_MAX": lambda: ggml.ggml_soft_max(ctx, t), "GELU": lambda: ggml.ggml_gelu(ctx, t),
          "SILU": lambda: ggml.ggml_silu(ctx, t)}[op]
    want = _ggml_eval(ctx, fn())
    node = Tensor("n", "UNARY" if op in ("GELU", "SILU") else op, ne=(32, 4), op_desc=op)
    got = compute(node, [_as4(x)], {"eps": 1e-5})
    assert np.allclose(got, want, atol=2e-3), np.abs(got - want).max()


def test_diag_mask_get_rows_and_repeat_match_ggml(ctx):
    x = RNG.standard_normal((2, 6, 6)).astype(np.float32)
    want = _ggml_eval(ctx, ggml.ggml_diag_mask_inf(ctx, _ggml_tensor(ctx, x), 1))
    got = compute(Tensor("n", "DIAG_MASK_INF", ne=(6, 6, 2)), [_as4(x)], {"n_past": 1})
    assert np.array_equal(got, want)
    table = RNG.standard_normal((10, 8)).astype(np.float32)
    idx = np.array([3, 0, 9, 3], dtype=np.int32)
    want = _ggml_eval(ctx, ggml.ggml_get_rows(ctx, _ggml_tensor(ctx, table), _ggml_tensor(ctx, idx)))
    got = compute(Tensor("n", "GET_ROWS", ne=(8, 4)), [_as4(table), _as4(idx)])
    assert np.array_equal(got, want)
    row = RNG.standard_normal((1, 8)).astype(np.float32)
    shape_t = _ggml_tensor(ctx, np.zeros((5, 8), np.float32))
    want = _ggml_eval(ctx, ggml.ggml_repeat(ctx, _ggml_tensor(ctx, row), shape_t))
    got = compute(Tensor("n", "REPEAT", ne=(8, 5)), [_as4(row)])
    assert np.array_equal(got, want)


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_matches_ggml(ctx, mode):
    x = RNG.standard_normal((5, 3, 16)).astype(np.float32)  # ne (16 head_dim, 3 heads, 5 tokens)
    pos = np.array([4, 5, 6, 7, 8], dtype=np.int32)
    want = _ggml_eval(ctx, ggml.ggml_rope(ctx, _ggml_tensor(ctx, x), _ggml_tensor(ctx, pos), 16, mode))
    got = compute(Tensor("n", "ROPE", ne=(16, 3, 5)), [_as4(x), _as4(pos)], {"n_dims": 16, "rope_mode": mode})
    assert np.allclose(got, want, atol=1e-4)


def test_cpy_into_a_transposed_view_matches_ggml(ctx):
    x = RNG.standard_normal((4, 6)).astype(np.float32)  # ne (6, 4)
    t = _ggml_tensor(ctx, x)
    tt = ggml.ggml_transpose(ctx, t)  # ne (4, 6), strided
    want = _ggml_eval(ctx, ggml.ggml_cont(ctx, tt))
    src = _as4(x).transpose(0, 1, 3, 2)  # the transposed view's values, shaped (1, 1, 6, 4)
    got = compute(Tensor("n", "CONT", ne=(4, 6)), [src])
    assert np.array_equal(got, want)
