"""Alignment by tensor identity: occurrences, unnamed tensors, insertions, deletions, reorderings."""
import random

import numpy as np
import pytest

from alloctrace.allocator import Event
from alloctrace.traces.diff.align import align, identity_keys, longest_increasing, placements
from alloctrace.traces.diff.graphs import diff_graphs


def lis_length_quadratic(seq):
    best = [1] * len(seq)
    for i in range(len(seq)):
        for j in range(i):
            if seq[j] < seq[i]:
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)


@pytest.mark.parametrize("seed", range(20))
def test_longest_increasing_against_the_quadratic_definition(seed):
    rng = random.Random(seed)
    seq = np.array([rng.randrange(30) for _ in range(rng.randrange(0, 40))], dtype=np.int64)
    keep = longest_increasing(seq)
    assert len(keep) == lis_length_quadratic(seq.tolist())
    assert np.all(np.diff(keep) > 0) and np.all(np.diff(seq[keep]) > 0)


def test_identity_is_name_plus_occurrence():
    ids = {}
    keys = identity_keys(["a", "b", "a", "", "a", ""], ids)
    occurrence = (keys & 0xFFFFFFFF).tolist()
    assert occurrence == [0, 0, 1, 0, 2, 1]
    assert len(set(keys.tolist())) == 6 and identity_keys(["a"], ids)[0] == keys[0]


def stream(names, sizes=None, offsets=None):
    """alloc events at consecutive offsets (or given ones), each followed by an exec line."""
    out, off = [], 0
    for i, n in enumerate(names):
        size = sizes[i] if sizes else 32
        o = offsets[i] if offsets else off
        out += [Event("alloc", tensor=n, size=size, offset=o, block=0), Event("exec", tensor=n)]
        off += size
    return out


def test_insertions_and_deletions_keep_the_rest_aligned():
    a_names = [f"t{i}" for i in range(50)]
    b_names = a_names[:10] + ["new0", "new1"] + a_names[10:30] + a_names[35:]  # 2 inserted, 5 deleted
    pa, pb = placements(stream(a_names)), placements(stream(b_names))
    ia, ib = align(pa, pb)
    assert len(ia) == 45
    assert [pa.names[i] for i in ia] == [pb.names[i] for i in ib]
    d = diff_graphs(stream(a_names), stream(b_names))
    # offsets shift right after the insertion: that is the first divergence
    assert d.first_divergence["tensor"] == "t10" and d.first_divergence["fields"] == ["offset"]
    assert d.aligned["count"] == 45 and d.aligned["fraction_b"] == 45 / 47


def test_unnamed_tensors_align_by_position():
    a = stream(["", "x", "", ""], sizes=[16, 32, 48, 64])
    b = stream(["", "x", "", "", ""], sizes=[16, 32, 40, 64, 8])
    pa, pb = placements(a), placements(b)
    ia, ib = align(pa, pb)
    pairs = [(int(pa.size[i]), int(pb.size[j])) for i, j in zip(ia, ib)]
    assert pairs == [(16, 16), (32, 32), (48, 40), (64, 64)]


def test_swapped_tensors_keep_one_of_them():
    a, b = stream(["p", "q", "r", "s"]), stream(["p", "r", "q", "s"])
    ia, ib = align(placements(a), placements(b))
    assert len(ia) == 3 and np.all(np.diff(ib) > 0)


def test_failed_allocation_is_one_placement():
    evs = stream(["a"]) + [Event("alloc", tensor="b", size=64, block=-1),
                           Event("oom", tensor="b", needed=64, largest=32)]
    p = placements(evs)
    assert p.names == ["a", "b"] and p.kind.tolist() == [0, 2] and p.size.tolist() == [32, 64]
    head = stream(["a"]) + [Event("oom", tensor="c", needed=96, largest=0)]  # head prints no alloc line
    ph = placements(head)
    assert ph.names == ["a", "c"] and ph.kind.tolist() == [0, 2] and ph.size.tolist() == [32, 96]


def test_reuse_decisions_that_differ_are_listed():
    a = stream(["p"]) + [Event("reuse", tensor="q", parent="p", offset=0)] + stream(["r"], offsets=[32])
    b = stream(["p", "q", "r"])
    d = diff_graphs(a, b)
    assert d.deltas["reuse"] == [{"tensor": "q", "a": "p", "b": None}] and d.deltas["reuse_count"] == 1
    assert d.first_divergence["tensor"] == "q" and d.first_divergence["fields"][0] == "kind"
    same = diff_graphs(a, list(a))
    assert same.deltas["reuse"] == [] and same.first_divergence is None


def test_renamed_tensors_keep_their_own_names_in_the_oom_picture():
    """Both runs make the same first changes under other names: b's picture names b's tensors."""
    def run(p, y2, z):
        return (stream(["x0", f"{p}1", f"{p}2"]) + [Event("free", tensor=f"{p}1", offset=32, size=32)]
                + stream(["y", "y2", "z"], sizes=[16, 16, 16], offsets=[32, y2, z]))
    a = run("a", 48, 96)
    b = run("b", 96, 48) + [Event("free", tensor="y", offset=32, size=16),
                            Event("alloc", tensor="big", size=64, block=-1),
                            Event("oom", tensor="big", needed=64, largest=16)]
    d = diff_graphs(a, b, {"label": "a"}, {"label": "b", "capacity": 128})
    assert d.first_free_list_divergence["tensor"] == "z"
    live = [t["tensor"] for g in d.b["oom"]["stranded_by"] for t in g["live"]]
    assert live == ["z", "b2", "y2"] and d.b["oom"]["total_free"] == 32


def test_first_choice_divergence_skips_offset_only_differences():
    def run(size, blocks):
        return [Event("alloc", tensor=t, size=size, offset=i * size, block=b) for i, (t, b) in
                enumerate(zip("xyz", blocks))]
    d = diff_graphs(run(32, [0, 0, 0]), run(64, [0, 0, 1]))
    assert d.first_divergence["tensor"] == "y" and d.first_divergence["fields"] == ["offset", "size"]
    assert d.first_choice_divergence["tensor"] == "z" and "block" in d.first_choice_divergence["fields"]
    assert d.to_json()["first_choice_divergence"]["b"]["block"] == 1


def test_free_lists_that_reconverge_are_skipped_and_a_later_difference_found():
    """b frees q before p (same state once both are free), then frees r early: the free lists first
    differ before t, not before s."""
    def alloc(t, off, size=32):
        return Event("alloc", tensor=t, offset=off, size=size, block=0)

    def free(t, off):
        return Event("free", tensor=t, offset=off, size=32)

    head = [alloc("p", 0), alloc("q", 32), alloc("r", 64)]
    a = head + [free("p", 0), free("q", 32), alloc("s", 0, 64), alloc("t", 96), alloc("u", 128)]
    b = head + [free("q", 32), free("p", 0), alloc("s", 0, 64), free("r", 64), alloc("t", 96), alloc("u", 128)]
    d = diff_graphs(a, b)
    assert d.first_divergence is None
    fl = d.first_free_list_divergence
    assert fl["tensor"] == "t"
    assert fl["a"]["free_blocks"] == [[96, None, 0]] and fl["b"]["free_blocks"] == [[64, None, 0]]
    assert diff_graphs(a, a[:-1] + [free("r", 64), a[-1]]).first_free_list_divergence["tensor"] == "u"
