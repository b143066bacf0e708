"""Stored traces written out in other formats.

Owns: `formats` (FORMATS: the one registry of export formats the CLI and the API read), `ggml` (export, JSON Lines, lossless and read back by sources/jsonl.py; CSV of events;
Chrome trace JSON for Perfetto), `torch_formats` (FORMATS, write_chrome, write_jsonl: a PyTorch trace's devices as
Chrome trace JSON, a track per stream), `torch_jsonl` (write_jsonl: a PyTorch trace as JSON Lines holding
everything it stores, read back by sources/torch/jsonl.py), `report_html` (build: one self-contained HTML file
of a trace, with report_html.js and Plotly.js inside). A new exporter is a module here, listed in FORMATS where the CLI and the
API offer it.
"""
