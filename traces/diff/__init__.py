"""Two runs side by side: where they part, why, and what it cost.

Owns: `align` (placements lined up by tensor identity), `side` (one run's cursor over its states), `graphs`
(diff_graphs, diff_refs, DiffResult: the diff of two ggml graphs or traces), `torch_snapshots` (diff: two PyTorch
snapshots, where the peak moved), `torch_ranks` (compare: the ranks of one job side by side).
"""
