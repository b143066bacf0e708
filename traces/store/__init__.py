"""The stored form of a trace and the store that keeps it.

Owns: `schema` (TraceMeta, GraphRecord: the trace format), `records` (the same as a pydantic schema, for
JSON Lines and the API), `columns` (the column codec; `columns_fast`: its fast encoder; `columns_lazy`:
columns decompressed when first read), `store` (Store, open_store, NotFound, StoreFull) over a backend (`sqlite`: a
file; `postgres`: a shared database), `tags` (key=value tags), `migrations` (the tables and how an older store is upgraded), `blobs` (a graph's columns as one
value), `derived` (what the store keeps beside a long graph, described by the analyses that make it),
`graph_info` (facts every view of a graph needs), `damage` (checked decoding: Damaged, DerivedDamaged),
`doctor` (read every trace back and check its checksums, list and delete what is damaged, keep what could
not be checked), `copy` (one store's traces into another, ids and bytes kept: `store copy`), `torch_stored` (a stored PyTorch trace read back: per-device
columns, facts, the layout's action codes).

Nothing here imports a source or an analysis (a contract in pyproject.toml).
"""
