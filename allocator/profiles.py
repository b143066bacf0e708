"""ggml-alloc generations: what differs between them, as data.

Adding a generation means adding a Profile here and, if its graph walk is new,
a walk module; see the README's "Adding a generation".
"""
from __future__ import annotations

from dataclasses import dataclass

INPLACE_2023 = frozenset({
    "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR",
    "SQRT", "LOG", "UNARY", "ROPE", "RMS_NORM", "SET", "SOFT_MAX", "CONT",
})

INPLACE_HEAD = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV",
    "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK",
    "SOFT_MAX", "SOFT_MAX_BACK",
})


@dataclass(frozen=True)
class Profile:
    name: str
    commit: str
    family: str  # "legacy" (ggml_allocr, addresses) or "gallocr" (chunked offsets)
    best_fit_skips_last: bool  # PR #2639: the last block is only a fallback
    parse_seq: str  # "reorder" (PR #2627: -1 dropped, frees immediate) or "barrier" (PR #2757)
    inplace_ops: frozenset
    max_free_blocks: int
    view_parent_returns: bool  # 854e4530: a refused view parent ends the search unallocated
    assert_line: int  # line of the out-of-space GGML_ASSERT, a version fingerprint
    alignment: int = 16  # what the programs of that time used by default
    description: str = ""


PROFILES = {
    p.name: p
    for p in [
        Profile(
            name="ggml-2023-08-16", commit="854e45302b127ca1b01e3e636a81da62219c5667", family="legacy",
            best_fit_skips_last=False, parse_seq="reorder", inplace_ops=INPLACE_2023, max_free_blocks=128,
            view_parent_returns=True, assert_line=131,
            description="legacy ggml_allocr: best fit over all free blocks (the 70B Metal failure)",
        ),
        Profile(
            name="ggml-2023-08-22", commit="f03d74aa2eae3d21d3ab906ba27013eae1fa625e", family="legacy",
            best_fit_skips_last=True, parse_seq="reorder", inplace_ops=INPLACE_2023, max_free_blocks=128,
            view_parent_returns=True, assert_line=139,
            description="the last-block fallback of PR #2639 with parse_seq still a pure reorder: frees are "
                        "immediate while Metal runs a level concurrently (what PR #2757 fixed)",
        ),
        Profile(
            name="ggml-2023-08-28", commit="ea9193f066e77a2019d9cd07fcaa7046ecd1e8ed", family="legacy",
            best_fit_skips_last=True, parse_seq="barrier", inplace_ops=INPLACE_2023, max_free_blocks=128,
            view_parent_returns=False, assert_line=140,
            description="PR #2639 last-block fallback; parse_seq barriers defer frees (PR #2757)",
        ),
        Profile(
            name="ggml-head", commit="d99724f2b141fed9e1a9f402213506c081433465", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=INPLACE_HEAD, max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=32,
            description="ggml 0.15.3 gallocr: chunked dynamic allocator, reuse factor, outputs kept",
        ),
    ]
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None
