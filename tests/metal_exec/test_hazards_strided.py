"""Strided views are compared by the bytes they really touch, checked against brute-force byte sets."""
import random

from hypothesis import given, settings, strategies as st

from alloctrace.allocator.build import Ctx
from alloctrace.metal_exec.hazards import byte_runs, runs_meet


def bytes_of(t, start):
    out = set()
    for i3 in range(t.ne[3]):
        for i2 in range(t.ne[2]):
            for i1 in range(t.ne[1]):
                for i0 in range(t.ne[0]):
                    o = start + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]
                    out.update(range(o, o + 4))
    return out


def test_interleaved_heads_do_not_meet():
    ctx = Ctx(legacy=True)
    qkv = ctx.new_tensor_2d("f32", 3 * 8, 5)  # per token: 8 Q, 8 K, 8 V values
    q = ctx.view_2d(qkv, 8, 5, qkv.nb[1], 0)
    k = ctx.view_2d(qkv, 8, 5, qkv.nb[1], 8 * 4)
    assert not runs_meet(byte_runs(q, 0), byte_runs(k, 8 * 4))
    assert runs_meet(byte_runs(q, 0), byte_runs(qkv, 0))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 40), st.integers(0, 40), st.booleans(),
       st.integers(0, 10_000))
def test_runs_agree_with_byte_sets(ne0, ne1, off_a, off_b, transpose, seed):
    rnd = random.Random(seed)
    ctx = Ctx(legacy=True)
    base = ctx.new_tensor_2d("f32", 16, 8)
    a = ctx.view_2d(base, ne0, ne1, base.nb[1], off_a * 4)
    b = ctx.view_2d(base, rnd.randint(1, 6), rnd.randint(1, 5), base.nb[1] * rnd.randint(1, 2), off_b * 4)
    if transpose:
        b = ctx.transpose(b)
    sa, sb = off_a * 4, off_b * 4
    expected = bool(bytes_of(a, sa) & bytes_of(b, sb))
    assert runs_meet(byte_runs(a, sa), byte_runs(b, sb)) == expected
