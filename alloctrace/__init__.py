"""alloctrace: record, replay, diff and see ggml graph-allocator traces."""

__version__ = "0.1.0"
