"""The memory map of one graph: tensor lifetimes as rectangles, and the view windows a screen shows of them.

Owns: `lifetimes` (Lifetimes, extract: from the event columns), `view` (a view window: shapes merged per
grid cell, the free-list series), `lod` (the tile pyramid that answers wide windows), `saved` (lifetimes and
pyramid as one stored value), `live_ops` (the op of each live tensor at an event, for the state view).
Public names: Lifetimes, extract, with_lod, shape_columns, series_columns, window, window_shapes, window_series.
"""
from alloctrace.traces.memmap.lifetimes import Lifetimes, extract
from alloctrace.traces.memmap.view import (series_columns, shape_columns, window, window_series, window_shapes,
                                             with_lod)

__all__ = ["Lifetimes", "extract", "series_columns", "shape_columns", "window", "window_series", "window_shapes",
           "with_lod"]
