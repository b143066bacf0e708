"""The gallocr model with n buffer types (what a recording replays): ids, alignment, max size, shared types."""
from alloctrace.allocator import get_profile
from alloctrace.allocator.build import Ctx
from alloctrace.allocator.gallocr import BufferType, Gallocr

HEAD = get_profile("ggml-head")


def chain(n=4, size=100):
    """x -> cont -> cont -> ...: no op here reuses its parent (CONT is not inplace in head)."""
    ctx = Ctx()
    x = ctx.set_input(ctx.new_tensor_1d("f32", size // 4))
    t = x
    for _ in range(n):
        t = ctx.cont(t)
    ctx.set_output(t)
    return ctx.build_forward(t)


def test_each_buffer_has_its_own_allocator_and_alignment():
    g = chain()
    galloc = Gallocr(HEAD, buffer_types=[BufferType("A", 32, key=1), BufferType("B", 256, key=2)])
    node_ids = [0, 1, 0, 1]
    assert galloc.reserve(g, node_buffer_ids=node_ids, leaf_buffer_ids=[0] * g.n_leafs)
    assert galloc.alloc_graph(g)
    assert [galloc.buffer_of[n] for n in g.nodes] == node_ids
    # buffer B holds nodes 1 and 3: node 1 is freed after node 2 ran, so node 3 (an output) reuses its block
    assert galloc.buffer_sizes()[1] == 256
    assert {galloc.placement[n] for n in g.nodes[1::2]} == {(0, 0)}
    # buffer A: x, node 0, node 2, 100 bytes padded to 128 each; x is freed once node 0 read it, node 2 takes it
    assert galloc.buffer_sizes()[0] == 2 * 128
    assert galloc.placement[g.nodes[2]] == galloc.placement[g.leafs[0]]


def test_the_same_buffer_type_twice_shares_one_buffer():
    g = chain()
    a = BufferType("A", 32, key="same")
    galloc = Gallocr(HEAD, buffer_types=[a, a])
    assert galloc.reserve(g, node_buffer_ids=[0, 1, 0, 1], leaf_buffer_ids=[1] * g.n_leafs)
    assert galloc.alloc_graph(g)
    assert set(galloc.buffer_of.values()) == {0}
    sizes = galloc.buffer_sizes()
    single = Gallocr(HEAD, alignment=32)  # one buffer type, no ids: the same plan
    assert single.reserve(chain())
    assert sizes == [single.buffer_size, 0]  # a shared buffer counts once, as ggml_gallocr_get_buffer_size does


def test_max_size_splits_a_buffer_into_chunks():
    ctx = Ctx()
    x = ctx.set_input(ctx.new_tensor_1d("f32", 16))
    outs = [ctx.set_output(ctx.cont(x)) for _ in range(3)]  # 64 bytes each, all alive to the end
    g = ctx.build_forward(*outs)
    galloc = Gallocr(HEAD, buffer_types=[BufferType("small", 32, max_size=100)])
    assert galloc.reserve(g)
    # a chunk is max(max size, the tensor) = 100 bytes: after one 64-byte tensor no other fits, so one chunk each
    assert galloc.buffer_chunk_sizes[0] == [64, 64, 64, 64]
    assert galloc.planned_sizes() == [256]


def test_multi_buffer_alloc_graph_does_not_replan_by_itself():
    g1, g2 = chain(4), chain(5)
    galloc = Gallocr(HEAD, buffer_types=[BufferType("A", 32, key=1), BufferType("B", 32, key=2)])
    assert galloc.reserve(g1, node_buffer_ids=[0, 1, 0, 1], leaf_buffer_ids=[0])
    assert not galloc.alloc_graph(g2)  # ggml: "cannot reallocate multi buffer graph automatically"
    assert galloc.events[-1].kind == "realloc"


def test_a_reused_parent_keeps_its_buffer():
    ctx = Ctx()
    x = ctx.set_input(ctx.new_tensor_1d("f32", 8))
    h = ctx.cont(x)
    y = ctx.scale(h, 0.5)  # inplace: takes h's memory, in h's buffer, whatever y's own buffer id says
    g = ctx.build_forward(y)
    galloc = Gallocr(HEAD, buffer_types=[BufferType("A", 32, key=1), BufferType("B", 32, key=2)])
    assert galloc.reserve(g, node_buffer_ids=[0, 1], leaf_buffer_ids=[0])
    assert galloc.alloc_graph(g)
    assert galloc.buffer_of[y] == 0 and galloc.placement[y] == galloc.placement[h]
    assert galloc.buffer_sizes() == [64, 0]
