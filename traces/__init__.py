"""Trace format, the SQLite store, importers for real logs, exporters (and diff).

`import_paths(store, paths, name=None, generation=None, progress=False)` imports
log files (plain, gzip or zstd) and returns the new trace ids.
"""


def import_paths(store, paths, name=None, generation=None, progress=False):
    from .sources.ggml_log.import_log import import_paths as _import_paths

    return _import_paths(store, paths, name=name, generation=generation, progress=progress)
