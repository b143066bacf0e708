"""The tile pyramid answers windows like the full scan: the same lifetimes in view, the same exact
answers; reduced answers stay within budget, count every lifetime in view once and keep each
tile's true bounding box; the series' buckets hold the worst case of the events they cover."""
from __future__ import annotations

import random

import numpy as np
import pytest

from alloctrace.traces import memmap

from alloctrace.traces.memmap import lod as memmap_lod
from test_memmap import columns_of, synthetic_events


def plain_and_lod(events, monkeypatch=None, count_tiles=None):
    if count_tiles is not None:
        monkeypatch.setattr(memmap_lod, "COUNT_TILES", count_tiles)
    plain = memmap.extract(columns_of(events))
    lod = memmap.with_lod(memmap.extract(columns_of(events)))
    return plain, lod


@pytest.fixture(scope="module")
def graphs():
    events = synthetic_events(60_000, seed=3)
    mp = pytest.MonkeyPatch()
    try:  # a small counting level, so several pyramid levels and border scans are exercised
        yield plain_and_lod(events, mp, 256)
    finally:
        mp.undo()


def windows(lt, count, seed):
    rng = random.Random(seed)
    top = lt.y_extent
    for _ in range(count):
        width = max(1, lt.n_events // rng.choice([1, 2, 10, 100, 1000, 20000]))
        x0 = rng.randrange(0, lt.n_events - width + 1)
        height = max(1, top // rng.choice([1, 3, 64]))
        y0 = rng.randrange(0, top - height + 1)
        yield x0, x0 + width, y0, y0 + height


def test_the_pyramid_has_levels_and_keeps_every_lifetime_once(graphs):
    _, lt = graphs
    pyr = lt.lod
    assert len(pyr.levels) > 3 and len(pyr.levels[0].key) == 1
    assert sorted(pyr.members.tolist()) == list(range(len(lt.start)))
    assert all(int(lv.count.sum()) == len(lt.start) for lv in pyr.levels)
    top = pyr.levels[0]
    assert (top.x0[0], top.x1[0], top.y0[0], top.y1[0]) == (lt.start.min(), lt.end.max(), lt.y0.min(), lt.y1.max())
    area = (lt.end - lt.start) * lt.size
    assert top.biggest[0] == int(np.flatnonzero(area == area.max())[0])


def test_windows_match_the_full_scan(graphs):
    plain, lt = graphs
    kinds = {True: 0, False: 0}
    for win in list(windows(lt, 120, 1)) + [(0, lt.n_events, 0, lt.y_extent)]:
        for max_shapes in (1, 40, 2000):
            want, want_total, want_reduced = memmap.shape_columns(plain, win, max_shapes)
            got, total, reduced = memmap.shape_columns(lt, win, max_shapes)
            assert total == want_total == len(plain.in_window(win)), win
            assert reduced == want_reduced == (total > max_shapes)
            kinds[reduced] += 1
            if not reduced:
                assert got == want
                continue
            x0, x1, y0, y1 = win
            assert 0 < len(got["n"]) <= max_shapes and sum(got["n"]) == total
            vis = plain.in_window(win)
            for s in zip(got["x0"], got["x1"], got["y0"], got["y1"]):
                assert s[0] < x1 and s[1] > x0 and s[2] < y1 and s[3] > y0
            # every lifetime in view lies inside some answered box
            boxes = np.array([got["x0"], got["x1"], got["y0"], got["y1"]])
            sample = vis[:: max(1, len(vis) // 200)]
            for i in sample.tolist():
                assert np.any((boxes[0] <= lt.start[i]) & (boxes[1] >= lt.end[i]) & (boxes[2] <= lt.y0[i])
                              & (boxes[3] >= lt.y1[i]))
    assert kinds[True] and kinds[False]


def test_series_buckets_hold_the_worst_case_of_their_events(graphs):
    plain, lt = graphs
    rng = random.Random(4)
    for _ in range(40):
        x0 = rng.randrange(0, lt.n_events - 1)
        x1 = rng.randrange(x0 + 1, lt.n_events + 1)
        max_points = rng.choice([1, 3, 50, 1000, 100_000])
        cols, width = memmap.series_columns(lt, x0, x1, max_points)
        assert 0 < len(cols["x"]) <= max_points
        assert width & (width - 1) == 0 and all(x % width == 0 for x in cols["x"])
        assert cols["x"][0] <= x0 < cols["x"][0] + width and cols["x"][-1] < x1 <= cols["x"][-1] + width
        for j in sorted({0, len(cols["x"]) - 1, *range(0, len(cols["x"]), max(1, len(cols["x"]) // 25))}):
            x = cols["x"][j]
            seg = slice(x, min(x + width, lt.n_events))
            for name, worst in (("used", np.nanmax), ("n_free", np.nanmax), ("largest_free", np.nanmin),
                                ("total_free", np.nanmin)):
                vals = getattr(plain, name)[seg]
                want = None if np.all(np.isnan(vals)) else int(worst(vals))
                assert cols[name][j] == want, (name, x, width)


def test_small_and_empty_graphs(fixtures):
    from alloctrace.allocator.events import Event
    empty = memmap.with_lod(memmap.extract(columns_of([Event("view", tensor="v", offset=0)])))
    assert memmap.shape_columns(empty, (0, 1, 0, 1), 10)[1:] == (0, False)
    events = synthetic_events(300, seed=5)
    plain, lt = plain_and_lod(events)
    for win in windows(lt, 30, 6):
        assert memmap.shape_columns(lt, win, 2000) == memmap.shape_columns(plain, win, 2000)


def test_column_pruning_finds_what_testing_every_tile_finds(graphs, monkeypatch):
    """answer() tests only the tiles of event columns that reach into the window; the answers equal
    those of testing every counting-level tile."""
    _, lt = graphs
    wins = list(windows(lt, 150, 7)) + [(0, lt.n_events, 0, lt.y_extent), (lt.n_events - 1, lt.n_events, 0, 1)]
    pruned = [memmap_lod._rows_near(lt.lod, w[0], w[1]) for w in wins]
    assert sum(r is not None for r in pruned) > 20
    got = [memmap_lod.answer(lt, lt.lod, w, m) for w in wins for m in (1, 40, 2000)]
    monkeypatch.setattr(memmap_lod, "_rows_near", lambda *a: None)
    want = [memmap_lod.answer(lt, lt.lod, w, m) for w in wins for m in (1, 40, 2000)]
    for (g, gt), (w, wt) in zip(got, want):
        assert gt == wt and type(g) is type(w)
        if isinstance(w, memmap_lod.Tiles):
            assert g.level == w.level and np.array_equal(g.rows, w.rows) and np.array_equal(g.n, w.n)
        else:
            assert np.array_equal(g, w)
