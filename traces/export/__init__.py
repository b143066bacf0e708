"""Stored traces written out in other formats.

Owns: `ggml` (export, FORMATS: JSON Lines, lossless and read back by sources/jsonl.py; CSV of events;
Chrome trace JSON for Perfetto). A new exporter is a module here, listed in FORMATS where the CLI and the
API offer it.
"""
