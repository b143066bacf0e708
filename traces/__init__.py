"""Trace format, the SQLite store, trace sources (sources/), exporters, state replay, diff.

`import_paths(store, paths, name=None, progress=False, **options)` imports files
(plain, gzip, zstd or xz) through `sources.import_file` and returns the new trace ids.
"""


def import_paths(store, paths, name=None, progress=False, **options):
    from .sources import import_paths as _import_paths

    return _import_paths(store, paths, name=name, progress=progress, **options)
