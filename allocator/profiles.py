"""ggml-alloc generations: everything that differs between them, as one table of data.

A `Profile` row is the only place a generation is described: the allocator
model reads its rules, the log importer its fingerprints and recovery style, the
presets its model-building quirks, the CLI help and the HTTP API its list. Adding
a generation means adding a row here and, if its graph walk is new, a walk
module; see docs/architecture.md.
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
    family: str  # walk family: "legacy" (ggml_allocr walk over tallocr addresses) or "gallocr" (offset plans)
    best_fit_skips_last: bool  # PR #2639: the last block is only a fallback
    parse_seq: str  # "reorder" (PR #2627: -1 dropped, frees immediate), "barrier" (PR #2757) or "none"
    inplace_ops: frozenset
    max_free_blocks: int
    view_parent_returns: bool  # 854e4530: a refused view parent ends the search unallocated
    assert_line: int  # line of the out-of-space GGML_ASSERT this generation prints (0: none)
    alignment: int = 16  # what the programs of that time used by default (CPU buffer type from v3 on)
    description: str = ""
    # --- how its AT_PRINTF log looks (detection and recovery) ---
    log_style: str = "block"  # allocating lines print: "block" K only, "addr" heap addresses, "offset", "chunk"
    other_assert_lines: tuple = ()  # later builds of the same allocator whose assert line moved
    buffer_pad: int = 0  # bytes the CPU buffer type adds to the size gallocr asks for (v3: one alignment)
    reserve_fn: str = "ggml_gallocr_reserve_n"  # the function that prints "reallocating ... buffer"
    alignments: tuple = (32, 16)  # alignments programs of the time used, widest first (a log's sizes tell which)
    backend_alignment: int = 0  # the CPU backend buffer's alignment (0: no backends yet); such buffers are
    #                             allocated at the measured size, plain ones one alignment larger
    # --- what the model presets need (the programs of that time) ---
    presets: bool = False  # `alloctrace replay` can run the Aug 2023 programs under it
    llama_names: str = "gguf"  # llama.cpp's tensor names: "pre-gguf" before Aug 21 2023, then "gguf"
    repeat_returns_same_shape: bool = False  # ggml_repeat(a, b) returned `a` when the shapes matched
    llama_metadata_bytes: int = 0  # llama.cpp's compute-buffer metadata added to the printed total

    @property
    def assert_lines(self) -> tuple:
        return ((self.assert_line,) if self.assert_line else ()) + tuple(self.other_assert_lines)

    def to_json(self) -> dict:
        return {"name": self.name, "commit": self.commit, "family": self.family, "presets": self.presets,
                "alignment": self.alignment, "description": self.description}


PROFILES = {
    p.name: p
    for p in [
        Profile(
            name="ggml-2023-08-16", commit="854e45302b127ca1b01e3e636a81da62219c5667", family="legacy",
            best_fit_skips_last=False, parse_seq="reorder", inplace_ops=INPLACE_2023, max_free_blocks=128,
            view_parent_returns=True, assert_line=131, presets=True, llama_names="pre-gguf",
            repeat_returns_same_shape=True, llama_metadata_bytes=1_409_744,
            description="legacy ggml_allocr: best fit over all free blocks (the 70B Metal failure)",
        ),
        Profile(
            name="ggml-2023-08-22", commit="f03d74aa2eae3d21d3ab906ba27013eae1fa625e", family="legacy",
            best_fit_skips_last=True, parse_seq="reorder", inplace_ops=INPLACE_2023, max_free_blocks=128,
            view_parent_returns=True, assert_line=139, presets=True, repeat_returns_same_shape=True,
            llama_metadata_bytes=1_475_280,
            description="the last-block fallback of PR #2639 with parse_seq still a pure reorder: frees are "
                        "immediate while Metal runs a level concurrently (what PR #2757 fixed)",
        ),
        Profile(
            name="ggml-2023-08-28", commit="ea9193f066e77a2019d9cd07fcaa7046ecd1e8ed", family="legacy",
            best_fit_skips_last=True, parse_seq="barrier", inplace_ops=INPLACE_2023, max_free_blocks=128,
            view_parent_returns=False, assert_line=140, other_assert_lines=(173, 174), presets=True,
            llama_metadata_bytes=1_475_280,
            description="PR #2639 last-block fallback; parse_seq barriers defer frees (PR #2757)",
        ),
        Profile(
            name="ggml-2023-10", commit="08d748b2", family="legacy",
            best_fit_skips_last=True, parse_seq="barrier", inplace_ops=INPLACE_2023, max_free_blocks=256,
            view_parent_returns=False, assert_line=148, other_assert_lines=(116, 114), log_style="addr",
            alignments=(64, 32, 16), backend_alignment=64,
            description="Oct 2023 - Jan 2024: the first ggml_tallocr / ggml_gallocr split (the scheduler); the "
                        "same free-block rules, messages with heap addresses, no graph markers",
        ),
        Profile(
            name="ggml-2024-02", commit="5070f078", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=INPLACE_HEAD, max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=64, log_style="offset", buffer_pad=64,
            description="gallocr v3: one offset-based ggml_dyn_tallocr, reserve once; the CPU buffer type "
                        "allocates max_size + 64",
        ),
        Profile(
            name="ggml-2025-09", commit="058c3973", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=INPLACE_HEAD, max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=32, log_style="offset",
            description="the last gallocr before chunks: all data-less leafs first, CPU alignment 32, "
                        "buffer = max_size",
        ),
        Profile(
            name="ggml-head", commit="d99724f2b141fed9e1a9f402213506c081433465", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=INPLACE_HEAD, max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=32, log_style="chunk",
            reserve_fn="ggml_gallocr_reserve_n_impl",
            description="ggml 0.15.3 gallocr: chunked dynamic allocator, reuse factor, outputs kept",
        ),
    ]
}
PRESET_PROFILES = tuple(name for name, p in PROFILES.items() if p.presets)
DEFAULT_PROFILE = "ggml-2023-08-28"  # what the model presets build when no generation is named


def get_profile(name) -> Profile:
    """The row of a generation; a Profile passes through."""
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def names(presets_only: bool = False) -> str:
    """The generations for help texts and messages: "a, b, c"."""
    return ", ".join(PRESET_PROFILES if presets_only else PROFILES)
