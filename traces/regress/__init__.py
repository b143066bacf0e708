"""Traces across runs: tags (`key=value`), the comparison of two commits' traces, buffer sizes per commit."""
