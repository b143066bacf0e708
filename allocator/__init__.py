"""A faithful, address-aware model of ggml's graph allocator (ggml-alloc.c), generation by generation.

No I/O here: build a Graph, run an allocator, read its events. The names below come from their modules
when first asked for: what only lists the generations (a command's help, `profiles`) imports no model.
"""
from importlib import import_module

# the function, imported now: importing its module later would put the module in its place
from .render import render

_WHERE = {"Event": "events", "KINDS": "events", "Gallocr": "gallocr", "LAYOUTS": "layout", "Layout": "layout",
          "get_layout": "layout", "LegacyAllocator": "legacy", "PROFILES": "profiles", "Profile": "profiles",
          "get_profile": "profiles", "Graph": "tensor", "Tensor": "tensor"}

__all__ = [*_WHERE, "render"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
