"""Which kind a stored trace is: a ggml allocator trace or a PyTorch memory snapshot.

The faces decide here and nowhere else: the CLI (`state`, `peak`, `diff`, `export`) and the server's
PyTorch routes ask `trace_kind`, and refuse a trace of the other kind with `require_kind`'s one message.
"""
from __future__ import annotations

from alloctrace.traces.errors import UserError

GGML, TORCH = "ggml", "torch"
TORCH_SOURCES = frozenset({"torch"})  # sources whose traces are PyTorch snapshots (one graph row per device)
LABEL = {GGML: "ggml allocator trace", TORCH: "PyTorch snapshot"}


class WrongKind(UserError):
    """A trace of the other kind than the command or page works with."""


def kind_of_source(source: str) -> str:
    return TORCH if source in TORCH_SOURCES else GGML


def trace_kind(store, ref: str) -> str:
    """GGML or TORCH for a stored trace ('ID' or 'ID:G'; NotFound for an unknown id)."""
    tid = store.resolve(str(ref).partition(":")[0])[0]
    return kind_of_source(store.meta(tid).source)


def require_kind(store, ref: str, kind: str, hint: str = "") -> tuple[str, int | None]:
    """(trace id, graph or device index or None) of a stored trace of `kind`; WrongKind otherwise, naming the
    trace, its source and, when given, where its kind is looked at instead (`hint`)."""
    tid, g = store.resolve(str(ref))
    source = store.meta(tid).source
    if kind_of_source(source) != kind:
        raise WrongKind(f"trace {tid} is not a {LABEL[kind]} (source {source!r})" + (f"; {hint}" if hint else ""))
    return tid, g


def require_same_kind(store, ref_a: str, ref_b: str, kind: str | None = None) -> str:
    """The kind both traces share (and `kind`, when given); WrongKind, in one line, for a mixed pair."""
    ka, kb = trace_kind(store, ref_a), trace_kind(store, ref_b)
    if ka != kb:
        raise WrongKind(f"cannot diff {ref_a} (a {LABEL[ka]}) against {ref_b} (a {LABEL[kb]}): "
                        "diff two traces of the same kind")
    if kind is not None and ka != kind:
        raise WrongKind(f"{ref_a} and {ref_b} are not {LABEL[kind]}s")
    return ka
