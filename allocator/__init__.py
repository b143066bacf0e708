"""A faithful, address-aware model of ggml's graph allocator (ggml-alloc.c), generation by generation.

No I/O here: build a Graph, run an allocator, read its events.
"""
from .events import Event, KINDS
from .gallocr import Gallocr
from .layout import LAYOUTS, Layout, get_layout
from .legacy import LegacyAllocator
from .profiles import PROFILES, Profile, get_profile
from .render import render
from .tensor import Graph, Tensor

__all__ = ["Event", "KINDS", "Gallocr", "LAYOUTS", "Layout", "get_layout", "LegacyAllocator", "PROFILES",
           "Profile", "get_profile", "render", "Graph", "Tensor"]
