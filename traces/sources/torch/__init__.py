"""PyTorch CUDA memory snapshots (`torch.cuda.memory._snapshot()` pickles) as a trace source.

Read without torch and without running pickle code (unpickle.py), laid out as
per-device columns (columns.py), stored one device per graph row (source.py,
store.py), and looked at through views (views.py: timeline, state, peak, OOM)
and diffs (diff.py).
"""
