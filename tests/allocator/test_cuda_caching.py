"""The CUDA caching-allocator model on hand-built request sequences (numbers worked out by hand)."""
import pytest

from alloctrace.allocator.cuda_caching import (
    ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP,
    AllocatorSettings, CachingAllocator, OutOfMemory, allocation_size, round_size)

MiB = 1 << 20


class FakeDevice:
    """cudaMalloc handing out addresses 1 GiB apart, never failing."""

    def __init__(self):
        self.next = 1 << 40
        self.freed = []

    def malloc(self, size, stream):
        self.next += 1 << 30
        return self.next

    def free(self, addr, size):
        self.freed.append((addr, size))

    def reserve(self, size, stream):
        self.next += 1 << 42
        return self.next

    def map(self, addr, size):
        return True

    def unmap(self, addr, size):
        pass


def model(**kw):
    return CachingAllocator(AllocatorSettings(**kw), FakeDevice())


def test_rounding_by_hand():
    s = AllocatorSettings()
    assert round_size(1, s) == 512
    assert round_size(512, s) == 512
    assert round_size(513, s) == 1024
    assert round_size(3 * MiB + 1, s) == 3 * MiB + 512
    # four divisions of [1 MiB, 2 MiB): 1, 1.25, 1.5, 1.75 MiB
    s4 = AllocatorSettings(roundup_power2_divisions=(4,) * 16)
    assert round_size(MiB + 1, s4) == MiB + MiB // 4
    assert round_size(MiB + MiB // 4, s4) == MiB + MiB // 4
    assert round_size(2 * MiB, s4) == 2 * MiB                  # powers of two stay
    assert round_size(1500, s4) == 1536                        # at most 512 x divisions: plain 512 rounding


def test_segment_sizes_by_hand():
    assert allocation_size(512) == 2 * MiB
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(10 * MiB + 512) == 12 * MiB


def test_small_requests_pack_one_segment_and_merge_back():
    m = model()
    a = m.malloc(1000)
    b = m.malloc(3000)
    assert b.addr == a.addr + 1024                              # split off the same 2 MiB segment, next to a
    assert [e[0] for e in m.log] == [SEGMENT_ALLOC, ALLOC, ALLOC]
    a_addr = a.addr
    m.free(a)
    m.free(b)
    assert len(m.small.blocks) == 1         # merged back into one free 2 MiB block
    assert m.small.blocks[0][1] == 2 * MiB
    m.empty_cache()
    assert m.reserved == 0 and m.log[-1] == (SEGMENT_FREE, a_addr, 2 * MiB, 0)


def test_large_split_only_above_one_mib():
    m = model()
    a = m.malloc(8 * MiB)                                      # 20 MiB segment, 12 MiB left: split
    a_addr = a.addr
    assert a.size == 8 * MiB and m.reserved == 20 * MiB
    m.free(a)
    b = m.malloc(19 * MiB + 512)                               # 20 MiB block, 0.5 MiB left: not split
    assert b.addr == a_addr and b.size == 20 * MiB
    assert m.allocated == 20 * MiB and m.requested == 19 * MiB + 512


def test_best_fit_takes_smallest_then_lowest_address():
    m = model()
    blocks = [m.malloc(s) for s in (12 * MiB, 14 * MiB, 12 * MiB)]   # three segments of their own
    addrs = [b.addr for b in blocks]
    for b in blocks:
        m.free(b)
    c = m.malloc(11 * MiB)                                     # the 12 MiB blocks fit best; lower address first
    assert c.addr == min(addrs[0], addrs[2])


def test_streams_do_not_share_blocks():
    m = model()
    a = m.malloc(4 * MiB, stream=7)
    a_addr = a.addr
    m.free(a)
    b = m.malloc(4 * MiB, stream=9)
    assert b.addr != a_addr and m.reserved == 40 * MiB


def test_max_split_size_keeps_oversize_blocks_whole():
    m = model(max_split_size=32 * MiB)
    big = m.malloc(40 * MiB)
    big_addr = big.addr
    m.free(big)
    small = m.malloc(8 * MiB)                                  # an oversize block never serves a small request
    assert small.addr != big_addr and m.reserved == 60 * MiB
    near = m.malloc(40 * MiB - 512)                            # within 20 MiB of it: taken whole, unsplit
    assert near.addr == big_addr and near.size == 40 * MiB


def test_deferred_free_waits_for_its_events():
    m = model()
    a = m.malloc(4 * MiB)
    a_addr = a.addr
    m.free(a, deferred=True)
    assert [e[0] for e in m.log][-1] == FREE_REQUESTED
    b = m.malloc(4 * MiB)                                      # a is not free yet: b comes after it
    assert b.addr == a_addr + 4 * MiB
    m.complete_free(a)
    assert m.log[-1] == (FREE_COMPLETED, a_addr, 4 * MiB, 0)


def test_cap_releases_cached_segments_then_retries():
    m = model(memory_limit=40 * MiB)
    a = m.malloc(16 * MiB)
    b = m.malloc(16 * MiB)
    m.free(a)
    c = m.malloc(20 * MiB)                                     # 32 + 20 > 40: free a's segment, retry: 16 + 20 fits
    assert m.num_alloc_retries == 1 and m.reserved == 36 * MiB
    assert [e[0] for e in m.log[-3:]] == [SEGMENT_FREE, SEGMENT_ALLOC, ALLOC]
    with pytest.raises(OutOfMemory):
        m.malloc(6 * MiB)                                      # needs a 20 MiB segment: 56 > 40
    assert m.log[-1][0] == OOM and m.num_ooms == 1 and b.allocated and c.allocated


def test_expandable_segment_grows_in_20_mib_pages_and_unmaps():
    m = model(expandable_segments=True)
    a = m.malloc(30 * MiB)
    base = a.addr                                              # (a freed block object is reused by merges)
    assert m.reserved == 40 * MiB                              # two 20 MiB pages mapped
    b = m.malloc(15 * MiB)                                     # 10 MiB free at the end + one more page
    assert b.addr == base + 30 * MiB and m.reserved == 60 * MiB
    assert [e[0] for e in m.log] == [SEGMENT_MAP, ALLOC, SEGMENT_MAP, ALLOC]
    m.free(a)
    m.empty_cache()                                            # a's 30 MiB hold one whole page: unmap it
    assert m.log[-1] == (SEGMENT_UNMAP, base, 20 * MiB, 0)
    assert m.reserved == 40 * MiB
    c = m.malloc(25 * MiB)                                     # remaps the hole first (lowest address)
    assert c.addr == base and m.log[-2] == (SEGMENT_MAP, base, 20 * MiB, 0)


def test_gc_frees_old_unsplit_blocks_under_a_fraction():
    m = model(memory_limit=100 * MiB, garbage_collection_threshold=0.5)
    x = m.malloc(30 * MiB)
    y = m.malloc(30 * MiB)
    m.free(x)
    m.free(y)
    m.malloc(40 * MiB)                                         # no fit; 60 > 50: GC frees both aged blocks first
    assert [e[0] for e in m.log[-4:]] == [SEGMENT_FREE, SEGMENT_FREE, SEGMENT_ALLOC, ALLOC]
    assert m.reserved == 40 * MiB


@pytest.mark.parametrize("bad", [dict(max_split_size=MiB), dict(roundup_power2_divisions=(3,) * 16),
                                 dict(garbage_collection_threshold=1.5)])
def test_bad_settings_refused(bad):
    with pytest.raises(ValueError):
        AllocatorSettings(**bad)


# -- the replay driver against the model's own traces ----------------------------------------------------------

from hypothesis import event, given, settings as hsettings, strategies as st  # noqa: E402

import numpy as np  # noqa: E402

from alloctrace.traces.whatif.torch_model import SimulatedDevice, replay_check  # noqa: E402

SIZES = st.one_of(st.integers(1, 1 << 20), st.integers(1 << 20, 12 << 20), st.integers(12 << 20, 90 << 20))
OPS = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "alloc", "free", "free", "defer", "complete",
                                          "empty"]), SIZES, st.sampled_from([0, 0, 0, 77]), st.integers(0, 10**6)),
               min_size=10, max_size=120)
SETTINGS = st.builds(AllocatorSettings,
                     max_split_size=st.sampled_from([(1 << 64) - 1, 40 * MiB]),
                     roundup_power2_divisions=st.sampled_from([(0,) * 16, (4,) * 16]),
                     expandable_segments=st.booleans(),
                     memory_limit=st.sampled_from([None, 120 * MiB, 250 * MiB]),
                     garbage_collection_threshold=st.sampled_from([0.0, 0.5]))


def _run_ops(settings, ops) -> CachingAllocator:
    m = CachingAllocator(settings, SimulatedDevice(1 << 40))
    live, waiting = [], []
    for op, size, stream, pick in ops:
        if op == "alloc":
            try:
                live.append(m.malloc(size, stream))
            except OutOfMemory:
                pass
        elif op in ("free", "defer") and live:
            b = live.pop(pick % len(live))
            m.free(b, deferred=(op == "defer"))
            if op == "defer":
                waiting.append(b)
        elif op == "complete" and waiting:
            m.complete_free(waiting.pop(pick % len(waiting)))
        elif op == "empty":
            m.empty_cache()
    return m


def _log_columns(m) -> dict:
    log = np.array(m.log, dtype=np.int64)
    return {"action": log[:, 0].astype(np.int8), "addr": log[:, 1], "size": log[:, 2], "stream": log[:, 3]}


def test_oversize_release_skips_expandable_blocks():
    """max_split_size with expandable segments under a cap: the oversize release must not take an expandable
    block as a whole segment (found by the property test below); the retry unmaps its free pages instead."""
    s = AllocatorSettings(max_split_size=40 * MiB, expandable_segments=True, memory_limit=120 * MiB)
    ops = [("alloc", 1, 0, 0), ("alloc", 1048577, 77, 0), ("alloc", 10820609, 0, 0), ("alloc", 52093441, 0, 0),
           ("free", 1, 0, 3), ("alloc", 1048577, 0, 0)]
    m = _run_ops(s, ops)
    assert [e[0] for e in m.log[-2:]] == [SEGMENT_UNMAP, ALLOC]            # the retry unmapped free pages
    assert SEGMENT_FREE not in [e[0] for e in m.log] and m.num_alloc_retries == 1
    assert replay_check(_log_columns(m), s).consistent


@hsettings(max_examples=int(__import__('os').environ.get('CUDA_MODEL_EXAMPLES', 60)), deadline=None)
@given(SETTINGS, OPS)
def test_model_traces_replay_consistently(settings, ops):
    """Whatever the model does (releases, retries, OOMs, deferred frees, empty_cache, two streams), a trace it
    wrote replays consistently: the driver reads requests back out of any trace of this allocator."""
    m = _run_ops(settings, ops)
    if not m.log:
        return
    for code, name in ((OOM, "oom"), (SEGMENT_FREE, "segment_free"), (SEGMENT_UNMAP, "unmap")):
        if any(e[0] == code for e in m.log):
            event(name)
    if m.num_alloc_retries:
        event("retry")
    r = replay_check(_log_columns(m), settings)
    assert r.consistent, r.mismatch
    assert r.peak_reserved >= m.reserved and len(r.ooms) == m.num_ooms


@hsettings(max_examples=int(__import__('os').environ.get('CUDA_MODEL_EXAMPLES', 60)), deadline=None)
@given(SETTINGS, OPS, st.sampled_from([0, 3]))
def test_list_pools_decide_as_sorted_list_pools(settings, ops, limit):
    """A pool keeps its free blocks in a plain sorted list while they are few, in a SortedList past
    LIST_POOL_LIMIT: the same requests give the same log (every decision, address and size) with the plain
    list throughout, a SortedList throughout (limit 0), and a switch part way (limit 3)."""
    import alloctrace.allocator.cuda_caching as cc

    plain = _run_ops(settings, ops)
    default = cc.LIST_POOL_LIMIT
    cc.LIST_POOL_LIMIT = limit
    try:
        other = _run_ops(settings, ops)
    finally:
        cc.LIST_POOL_LIMIT = default
    assert other.log == plain.log
    assert (other.reserved, other.allocated) == (plain.reserved, plain.allocated)
    if limit == 0:
        assert all(type(p.blocks) is not list for p in (other.small, other.large) if p.blocks)


@pytest.mark.parametrize("limit", [2048, 0])
def test_both_kinds_of_pool_refuse_to_erase_a_block_they_do_not_hold(monkeypatch, limit):
    """Erasing a key a list pool does not hold raises as SortedList.remove does, instead of deleting the next
    key (a what-if replay from a start no allocator could have had reaches it: test_torch_fuzz.py)."""
    import alloctrace.allocator.cuda_caching as cc

    monkeypatch.setattr(cc, "LIST_POOL_LIMIT", limit)
    pool = cc.Pool(False)
    held, absent = cc.Block(1 << 30, 4 * MiB, 0, False), cc.Block(1 << 30, 2 * MiB, 0, False)
    pool.insert(held)
    with pytest.raises(ValueError):
        pool.erase(absent)
    assert list(pool.blocks) == [(0, 4 * MiB, 1 << 30)]
    assert type(pool.blocks) is (list if limit else cc.SortedList)
