"""PyTorch CUDA memory snapshots (`torch.cuda.memory._snapshot()` pickles) as a trace source.

Owns: `unpickle` (load_plain, SnapshotError: a pickle read without torch and without running pickle code),
`columns` (split_devices: a snapshot as per-device columns), `source` (SOURCE, read_snapshot: one device per
stored graph row, checked against the caching-allocator model), `jsonl` (SOURCE: a PyTorch trace's JSON Lines
export read back as the same rows; `jsonl_schema`: its lines), `recorder` + `hook/` (`alloctrace record` of a
Python program: the environment that switches PyTorch's memory history on). Many ranks' files as one trace:
traces/sources/ranks.py. Reading the stored form back is
traces/store/torch_stored.py; the views are in the analysis rooms (state/torch_device.py, memmap/torch_timeline.py,
explain/torch_peak.py, diff/torch_snapshots.py, whatif/torch_model.py); the exporters are traces/export/torch_formats.py and torch_jsonl.py.
"""
