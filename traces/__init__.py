"""Everything about a stored trace, in rooms by responsibility (docs/architecture.md draws the map):

- `store/`: the trace format, the SQLite store, the column codecs, the store's tables and upgrades;
- `sources/`: every trace source (`ggml_log/`, `jsonl`, `torch/`, `record/`) behind one `import_file`;
- analyses: `state/`, `memmap/`, `diff/`, `explain/`, `whatif/`; `export/`: exporters;
- `replay/`, `preflight/`: the use cases (replay a preset, sweep it; pre-flight sweeps of real programs);
- `util/`: small shared utilities; `errors.py`: `UserError`.

`import_paths(store, paths, name=None, progress=False, **options)` imports files
(plain, gzip, zstd or xz) through `sources.import_file` and returns the new trace ids.

This root also hands the store the derived data it keeps for a long graph (store/derived.py): the
analyses describe it, so the store never imports them.
"""
from alloctrace.traces.store import derived as _derived


def import_paths(store, paths, name=None, progress=False, **options):
    from alloctrace.traces.sources import import_paths as _import_paths

    return _import_paths(store, paths, name=name, progress=progress, **options)


def _derived_data() -> tuple:
    from alloctrace.traces.memmap.saved import DERIVED as lifetimes
    from alloctrace.traces.state.index import DERIVED as checkpoints

    return checkpoints, lifetimes


_derived.provide(_derived_data)
