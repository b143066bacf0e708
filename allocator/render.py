"""Events back to the exact AT_PRINTF text of each ggml generation."""
from __future__ import annotations

from .events import Event
from .profiles import PROFILES, Profile


def c_pointer(addr: int | None) -> str:
    """glibc's %p: `(nil)` for NULL, else lowercase hex."""
    return "(nil)" if not addr else hex(addr)


def _exec_2023(ev: Event) -> str:
    return f"exec: {ev.op} ({ev.tensor}) <= " + ", ".join(ev.srcs or [])


def _exec_head(ev: Event) -> str:
    # ggml skips empty slots but puts ", " only before a non-empty next slot
    srcs = ev.srcs or []
    out = []
    for j, s in enumerate(srcs):
        if s is None:
            continue
        out.append(s)
        if j + 1 < len(srcs) and srcs[j + 1] is not None:
            out.append(", ")
    return f"exec: {ev.op} ({ev.tensor}) <= " + "".join(out)


def _no_reuse(ev: Event) -> str:
    why = {"external": f"{c_pointer(ev.addr)} is external", "layout": "layouts are different",
           "output": "it is an output"}[ev.reason]
    return f"not reusing parent {ev.parent} for {ev.tensor} as {why}"


def _reuse(ev: Event) -> str:
    if ev.view_src:
        return f"reusing view parent {ev.parent} ({ev.view_src}) for {ev.tensor}"
    return f"reusing parent {ev.parent} for {ev.tensor}"


def render_legacy(ev: Event, profile: Profile, assert_path: str) -> list[str]:
    k = ev.kind
    tallocr = profile.log_style == "addr"  # Oct 2023: ggml_tallocr's functions, frees at their pointer
    if k == "alloc":
        fn = "ggml_tallocr_alloc" if tallocr else "ggml_allocr_alloc"
        return [f"{fn}: allocating {ev.tensor} ({ev.size} bytes) - block {ev.block}"]
    if k == "free":
        if tallocr:
            return [f"ggml_tallocr_free_tensor: freeing {ev.tensor} at {c_pointer(ev.addr)} ({ev.size} bytes) - "
                    f"n_free_blocks = {ev.n_free_before}"]
        return [f"ggml_allocator_free_tensor: freeing {ev.tensor} ({ev.size} bytes) - n_free_blocks = {ev.n_free_before}"]
    if k == "exec":
        return [_exec_2023(ev)]
    if k == "reuse":
        return [_reuse(ev)]
    if k == "no_reuse":
        return [_no_reuse(ev)]
    if k == "view_src":
        return [f"view_src {ev.tensor}: {ev.children} children, {ev.views} views"]
    if k in ("step", "barrier"):
        return [""]
    if k == "graph":
        return [f"####### graph {ev.extra['g']}/{ev.extra['n']}"]
    if k in ("input", "output"):
        return [f"{k}: {ev.tensor}"]
    if k == "oom":
        return [f"ggml_allocr_alloc: {oom_message(profile, ev.needed, ev.largest)}",
                f'GGML_ASSERT: {assert_path}:{profile.assert_line}: !"not enough space in the buffer"']
    if k == "abort":
        return [f'GGML_ASSERT: {assert_path}:0: alloc->n_free_blocks < MAX_FREE_BLOCKS && "out of free blocks"']
    return []


def render_head(ev: Event, profile: Profile, assert_path: str) -> list[str]:
    k = ev.kind
    chunked = profile.log_style == "chunk"  # v3 and the pre-chunk gallocr print plain offsets
    if k == "alloc":
        if not chunked:
            return [f"ggml_dyn_tallocr_alloc: allocating {ev.tensor} ({ev.size} bytes) - block {ev.block}, "
                    f"offset {ev.offset}"]
        return [f"ggml_dyn_tallocr_alloc: allocating {ev.tensor} ({ev.size} bytes) - block {ev.block}, "
                f"offset {ev.offset}, chunk {ev.chunk}"]
    if k == "free":
        if not chunked:
            return [f"ggml_dyn_tallocr_free_tensor: freeing {ev.tensor} at {ev.offset} ({ev.size} bytes) - "
                    f"n_free_blocks = {ev.n_free_before}"]
        return [f"ggml_gallocr_free_node: freeing {ev.tensor} at {{chunk={ev.chunk}, offset={ev.offset}}} "
                f"({ev.size} bytes) - n_free_blocks = {ev.n_free_before}"]
    if k == "exec":
        return [_exec_head(ev)]
    if k == "parent":
        return [f"parent {ev.tensor}: {ev.children} children, {ev.views} views, allocated: {ev.allocated}"]
    if k == "view_src":
        return [f"view_src {ev.tensor}: {ev.children} children, {ev.views} views"]
    if k == "reuse":
        return [_reuse(ev)]
    if k == "no_reuse":
        return [_no_reuse(ev)]
    if k == "free_extra":
        return [f"freeing extra {ev.size} bytes from parent {ev.parent} for {ev.tensor}"]
    if k == "not_freed":
        return [f"not freeing output {ev.tensor}"]
    if k == "step":
        return [""]
    if k == "realloc":
        return [f"ggml_gallocr_needs_realloc: {ev.reason}", "ggml_gallocr_alloc_graph: reallocating buffers automatically"]
    if k == "buffer":
        mib = 1024.0 * 1024.0
        return [f"{profile.reserve_fn}: reallocating {ev.reason} buffer from size "
                f"{ev.extra['from'] / mib:.2f} MiB to {ev.size / mib:.2f} MiB"]
    if k == "oom":
        return [f"ggml_dyn_tallocr_alloc: {oom_message(profile, ev.needed, ev.largest)}"]
    if k == "abort":
        return [f'GGML_ASSERT: {assert_path}:0: chunk->n_free_blocks < MAX_FREE_BLOCKS && "out of free blocks"']
    return []


def oom_message(profile: Profile, needed, largest) -> str:
    """The words ggml prints when an allocation does not fit (the text users search for), by generation."""
    if profile.family == "gallocr":
        return f"not enough space in the buffer to allocate {needed} bytes, largest block available {largest} bytes"
    return f"not enough space in the buffer (needed {needed}, largest block available {largest})"


def ggml_oom_message(generation: str | None, needed, largest) -> str | None:
    """oom_message for a trace's generation name; None when it names no known generation."""
    profile = PROFILES.get(generation or "")
    return None if profile is None else oom_message(profile, needed, largest)


def render(events, profile: Profile, assert_path: str = "ggml/src/ggml-alloc.c") -> list[str]:
    """The AT_PRINTF lines (and the allocator's own error lines) these events stand for."""
    fn = render_head if profile.family == "gallocr" else render_legacy
    out: list[str] = []
    for ev in events:
        out.extend(fn(ev, profile, assert_path))
    return out
