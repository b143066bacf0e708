"""The memory-map answer encoded from columns is the same document as the generic encoding, and a
narrow window finds the same lifetimes as a scan of all of them."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from alloctrace.allocator.events import Event
from alloctrace.server.mapjson import memory_map_json
from alloctrace.traces import memmap
from test_memmap import columns_of, synthetic_events

def memory_map(lt: memmap.Lifetimes, info: dict, win, max_shapes: int, max_points: int) -> dict:
    """The reference: the answer built as a dict from the generic reductions, then JSON-encoded."""
    shapes = memmap.window_shapes(lt, win, max_shapes)
    series, bucket = memmap.window_series(lt, win[0], win[1], max_points)
    return {"n_events": lt.n_events, "window": dict(zip(("x0", "x1", "y0", "y1"), win)),
            "y_extent": lt.y_extent, "chunks": lt.chunks, **shapes,
            "free_list": series, "free_list_bucket": bucket,
            "max_size": info.get("max_size"), "buffer_size": info.get("buffer_size"), "oom": info.get("oom")}


ODD_NAMES = ['quote " and \\ back', "ünïcødé ✓", "<script>", "tab\tnew\nline", "%d %s", ""]


@pytest.fixture(scope="module")
def lt():
    events = synthetic_events(200_000, seed=9)
    for k, e in enumerate(events[:2000]):  # names JSON must escape, and unnamed ops
        if e.kind == "alloc":
            e.tensor = ODD_NAMES[k % len(ODD_NAMES)]
            e.op = None if k % 3 == 0 else e.op
    return memmap.extract(columns_of(events))


def windows(lt, count, seed):
    rng = random.Random(seed)
    top = lt.y_extent
    for _ in range(count):
        width = max(1, lt.n_events // rng.choice([1, 3, 10, 100, 1000, 10000]))
        x0 = rng.randrange(0, lt.n_events - width + 1)
        height = max(1, top // rng.choice([1, 4, 64]))
        y0 = rng.randrange(0, top - height + 1)
        yield (x0, x0 + width, y0, y0 + height)


def test_encoded_map_equals_the_generic_encoding(lt):
    info = {"max_size": lt.y_extent, "buffer_size": None, "oom": {"event": 3, "tensor": "ü\"x", "needed": 5}}
    reduced = exact = 0
    for win in list(windows(lt, 30, 1)) + [(0, 50, 0, lt.y_extent)]:
        for max_shapes, max_points in ((2000, 1000), (7, 3)):
            want = memory_map(lt, info, win, max_shapes, max_points)
            got = json.loads(memory_map_json(lt, info, win, max_shapes, max_points))
            assert got == want, win
            reduced += want["reduced"]
            exact += not want["reduced"] and want["count"] > 0
    assert reduced and exact
    first = json.loads(memory_map_json(lt, info, (0, 50, 0, lt.y_extent), 2000, 1000))
    assert {s["tensor"] for s in first["shapes"]} & set(ODD_NAMES)


def test_narrow_windows_find_what_a_full_scan_finds(lt):
    assert lt.n_events >= 100_000 and len(lt.start) > 4096
    for x0, x1, _, _ in windows(lt, 200, 2):
        full = np.flatnonzero((lt.start < x1) & (lt.end > x0))
        assert np.array_equal(lt.in_events(x0, x1), full), (x0, x1)
    assert lt._by_start is not None  # the narrow path ran


def test_a_graph_without_lifetimes_encodes():
    lt0 = memmap.extract(columns_of([Event("view", tensor="v", offset=0)]))
    info = {"max_size": None, "buffer_size": None, "oom": None}
    win = memmap.window(lt0, info, None, None, None, None)
    assert json.loads(memory_map_json(lt0, info, win, 10, 10)) == memory_map(lt0, info, win, 10, 10)


@pytest.mark.parametrize("series_cached", [1 << 16, 8])
def test_pyramid_answers_encode_like_the_generic_encoding(lt, monkeypatch, series_cached):
    """With the tile pyramid the tile and series rows come from the rows made once per graph,
    also on the second ask; the document still equals the generic encoding."""
    from dataclasses import replace
    from alloctrace.server import mapjson
    monkeypatch.setattr(mapjson, "SERIES_CACHED", series_cached)
    lod = memmap.with_lod(replace(lt, lod=None, _by_start=None))
    info = {"max_size": lt.y_extent, "buffer_size": None, "oom": None}
    kinds = set()
    for win in list(windows(lod, 12, 3)) * 2 + [(0, lod.n_events, 0, lod.y_extent)]:
        for max_shapes, max_points in ((2000, 1000), (7, 3), (50, 5000)):
            want = memory_map(lod, info, win, max_shapes, max_points)
            assert json.loads(memory_map_json(lod, info, win, max_shapes, max_points)) == want, win
            kinds.add((want["reduced"], want["count"] < want["total_in_view"]))
    assert any(isinstance(k, tuple) and k[0] == "json-tiles" for k in lod.lod.faces)
    assert (True, True) in kinds and (False, False) in kinds


def test_names_are_quoted_as_json_dumps_quotes_them():
    from alloctrace.server.mapjson import quote_names
    rng = random.Random(2)
    chars = ['a', '"', '\\', '\x00', '\x1f', '\x7f', '\x85', '\u2028', '\ud800', 'ü', '✓', ' ', '<', '%', '/']
    names = ["".join(rng.choice(chars) for _ in range(rng.randrange(6))) for _ in range(3000)]
    assert quote_names(names) == [json.dumps(s, ensure_ascii=False) for s in names]
    mixed = names[:50] + [None, 7] + names[50:100]  # None and non-strings: one by one
    assert quote_names(mixed) == [json.dumps(s, ensure_ascii=False) for s in mixed]
    assert quote_names(np.asarray(mixed, dtype=object)) == [json.dumps(s, ensure_ascii=False) for s in mixed]


@pytest.mark.parametrize("series_cached", [1 << 16, 8])
def test_unknown_free_list_values_are_null_in_cached_and_uncached_levels(lt, monkeypatch, series_cached):
    """Before the first event that reports the free list its values are unknown (NaN): null."""
    from dataclasses import replace
    from alloctrace.server import mapjson
    monkeypatch.setattr(mapjson, "SERIES_CACHED", series_cached)
    head = np.arange(len(lt.n_free)) < 700
    lod = memmap.with_lod(replace(lt, lod=None, _by_start=None, n_free=np.where(head, np.nan, lt.n_free),
                                  total_free=np.where(head, np.nan, lt.total_free)))
    info = {"max_size": None, "buffer_size": None, "oom": None}
    nulls = 0
    for win in [(0, 300, 0, lod.y_extent), (0, 5000, 0, lod.y_extent), (650, 900, 0, lod.y_extent),
                (0, lod.n_events, 0, lod.y_extent)]:
        for max_points in (1000, 7):
            want = memory_map(lod, info, win, 50, max_points)
            assert json.loads(memory_map_json(lod, info, win, 50, max_points)) == want, win
            nulls += sum(r["n_free"] is None for r in want["free_list"])
    assert nulls
