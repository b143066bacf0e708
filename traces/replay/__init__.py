"""Use cases that run a model preset the way a real program did, and store what it did.

Owns: `run` (replay, run_replay, store_result, preset_plans: measure, size the buffer, eval), `sweep`
(sweep, parse_values: one replay per (profile, n_ctx, n_batch) point). The top layer of traces/: it may use
every other room.
"""
