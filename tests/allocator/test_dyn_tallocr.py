"""Head's chunked allocator, on cases the CPU backend never reaches (it has no buffer size limit,
so real ggml never opens a second chunk there). Expectations follow ggml-alloc.c at d99724f2 by hand."""
from alloctrace.allocator.dyn_tallocr import SIZE_MAX, DynTallocr


def test_a_tensor_that_does_not_fit_opens_a_new_chunk():
    d = DynTallocr(alignment=32, max_buffer_size=1024)
    assert d.alloc(512) == (0, 0, 0)  # chunk 0 created with max(512, 1024) bytes
    assert d.alloc(768) == (1, 0, 0)  # 512 left in chunk 0: a second chunk
    assert [c.max_size for c in d.chunks] == [512, 768]
    assert d.chunks[0].sizes == [512] and d.chunks[1].sizes == [256]


def test_last_blocks_are_chosen_by_reuse_factor():
    d = DynTallocr(alignment=32, max_buffer_size=1024)
    d.alloc(512)
    d.alloc(768)
    # both last blocks would grow their chunk by 256 (reuse factor -256): the first one stays
    assert d.alloc(256) == (0, 0, 512)
    d.free(0, 0, 512)
    # chunk 1 has 0 B below its max_size; chunk 0's last block (768..1024) is beyond its max 768:
    # a free non-last block (0..512) in chunk 0 is the best fit and comes first
    assert d.alloc(256) == (0, 0, 0)


def test_a_last_block_inside_max_size_beats_one_that_grows_the_chunk():
    d = DynTallocr(alignment=32, max_buffer_size=1024)
    d.alloc(1024)  # chunk 0 full
    a = d.alloc(512)  # chunk 1: 0..512
    d.alloc(256)  # chunk 1: 512..768, max_size 768
    d.free(*a[::2], 512)  # chunk 1 blocks: (0,512) and last (768,256)
    assert d.chunks[1].offsets == [0, 768]
    # a new chunk 2 with a last block at 0
    assert d.alloc(1024) == (2, 0, 0)
    d.free(2, 0, 1024)  # chunk 2: last block (0, 1024), max_size 1024: reuse for 512 is +512
    # chunk 1's non-last block (0,512) fits exactly and wins before any last block is considered
    assert d.alloc(512) == (1, 0, 0)
    # only last blocks remain: chunk 1's (768, 256) would grow that chunk by 256 (reuse -256),
    # chunk 2's lies within its max_size (reuse +768): chunk 2 wins though chunk 1 comes first
    assert d.alloc(256) == (2, 0, 0)
    assert d.chunks[1].max_size == 768


def test_a_fit_in_a_later_chunk_overrides_a_tighter_fit_in_an_earlier_one():
    """ggml resets best_fit_size for every chunk, so the last chunk with any fitting block wins."""
    d = DynTallocr(alignment=32, max_buffer_size=1024)
    for size in (256, 256, 512):  # chunk 0 full
        d.alloc(size)
    for size in (512, 256, 256):  # chunk 1 full
        d.alloc(size)
    d.alloc(64)  # chunk 2, so that chunks 0 and 1 are not the newest
    d.free(0, 0, 256)
    d.free(0, 512, 512)  # chunk 0: non-last (0, 256), last (512, 512)
    d.free(1, 0, 512)
    d.free(1, 768, 256)  # chunk 1: non-last (0, 512), last (768, 256)
    assert d.chunks[0].sizes == [256, 512] and d.chunks[1].sizes == [512, 256]
    # 200 B (224 padded): chunk 0's 256 B block is the tighter fit, but chunk 1's 512 B block wins
    assert d.alloc(200) == (1, 0, 0)


def test_the_sixteenth_chunk_is_unbounded():
    d = DynTallocr(alignment=32, max_buffer_size=64)
    for _ in range(15):
        d.alloc(64)
    c, b, o = d.alloc(64)
    assert c == 15 and d.chunks[15].sizes == [SIZE_MAX // 2 - 64]
