"""The export formats, named once: the CLI's `export --format` choices, the API's `?format=` values, the download's
media type and file suffix, and which kinds of trace (ggml, torch) each applies to are all read from `FORMATS`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Callable

from alloctrace.traces.errors import UserError


@dataclass(frozen=True)
class ExportFormat:
    name: str
    media_type: str
    suffix: str          # the downloaded file's name ends in ".<suffix>"
    kinds: tuple[str, ...]  # trace kinds it applies to ("ggml", "torch": traces/store/kinds.py)
    what: str            # a few words for help texts and docs


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("chrome", "application/json", "chrome.json", ("ggml", "torch"),
                 "Chrome trace JSON (Perfetto, chrome://tracing)"),
    ExportFormat("jsonl", "application/x-ndjson", "jsonl", ("ggml", "torch"), "JSON Lines, lossless, re-importable"),
    ExportFormat("csv", "text/csv", "csv", ("ggml",), "CSV of events"),
)}


def names_for(kind: str) -> tuple[str, ...]:
    """The formats a trace of this kind exports as, in registry order."""
    return tuple(n for n, f in FORMATS.items() if kind in f.kinds)


def query_pattern() -> str:
    """The API's `format` parameter pattern: exactly the registry's names."""
    return "^(" + "|".join(FORMATS) + ")$"


def writer(kind: str, name: str, store, tid: str) -> Callable[[IO[str], object], None]:
    """A function `(out, progress)` writing trace `tid` in format `name`; UserError for a format the kind lacks."""
    if name not in names_for(kind):
        raise UserError(f"a {'PyTorch' if kind == 'torch' else kind} trace exports as "
                        f"{' or '.join(names_for(kind))}, not {name}")
    if kind == "torch":
        from alloctrace.traces.export import torch_formats as torch_export

        write = getattr(torch_export, f"write_{name}")
        return lambda out, progress: write(store, tid, out)
    from alloctrace.traces.export.ggml import export

    return lambda out, progress: export(store, tid, name, out, progress)
