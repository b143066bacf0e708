"""ggml-alloc generations: everything that differs between them, as one table of data.

A `Profile` row is the only place a generation is described: the allocator
model reads its rules, the log importer its fingerprints and recovery style, the
presets its model-building quirks, the CLI help and the HTTP API its list. Adding
a generation means adding a row here and, if its graph walk is new, a walk
module; see docs/architecture.md.
"""
from __future__ import annotations

from .record_class import record_class

# ggml_op_can_inplace over time: (op, first ggml commit listing it, first commit without it or "").
# Read from ggml-alloc.c's history (ggml repository; CLAMP from llama.cpp's vendored ggml). A profile row
# takes the ops listed on its date (`inplace_on`); the in-place tests in tests/allocator/test_inplace_ggml.py run each
# op through the real allocator.
INPLACE_HISTORY = (
    ("SCALE", "854e4530", ""), ("DIAG_MASK_ZERO", "854e4530", ""), ("DIAG_MASK_INF", "854e4530", ""),
    ("ADD", "854e4530", ""), ("ADD1", "854e4530", ""), ("SUB", "854e4530", ""), ("MUL", "854e4530", ""),
    ("DIV", "854e4530", ""), ("SQR", "854e4530", ""), ("SQRT", "854e4530", ""), ("LOG", "854e4530", ""),
    ("UNARY", "854e4530", ""), ("ROPE", "854e4530", ""), ("RMS_NORM", "854e4530", ""), ("SOFT_MAX", "854e4530", ""),
    ("ACC", "854e4530", "8ec4082a"), ("SET", "854e4530", "8ec4082a"),  # 2023-09-05, view_src sync
    ("CONT", "854e4530", "fc9e9558"),  # 2023-10-06, backends interface v1
    ("ROPE_BACK", "93ea0016", ""), ("SILU_BACK", "93ea0016", ""), ("RMS_NORM_BACK", "93ea0016", ""),
    ("SOFT_MAX_BACK", "93ea0016", ""),  # 2025-01-16, CUDA backward ops
    ("ADD_ID", "3b145175", ""),  # 2025-08-05, gpt-oss
    ("FILL", "106c2686", ""),  # 2025-12-09, llama.cpp #17870
    ("CLAMP", "llama.cpp#27644", ""),  # 2026-08-24: ggml_clamp stops being a view, reuses its parent instead
)
INPLACE_DATES = {"854e4530": "2023-08-16", "8ec4082a": "2023-09-05", "fc9e9558": "2023-10-06",
                 "93ea0016": "2025-01-16", "3b145175": "2025-08-05", "106c2686": "2025-12-09",
                 "llama.cpp#27644": "2026-08-24"}


def inplace_on(date: str) -> frozenset:
    """The ops ggml_op_can_inplace listed on `date` (YYYY-MM-DD)."""
    return frozenset(op for op, since, until in INPLACE_HISTORY
                     if INPLACE_DATES[since] <= date and not (until and INPLACE_DATES[until] <= date))


@record_class(frozen=True)
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
    backend_slack: int = 0  # bytes the CPU backend adds to a buffer it allocates (08d748b2's cpu_alloc_buffer:
    #                         size += TENSOR_ALIGNMENT, for a malloc base that is not aligned): room the real
    #                         allocator has beyond the size the program asked for
    # --- what the model presets need (the programs of that time) ---
    presets: bool = False  # `alloctrace replay` can run the Aug 2023 programs under it
    llama_names: str = "gguf"  # llama.cpp's tensor names: "pre-gguf" before Aug 21 2023, then "gguf"
    repeat_returns_same_shape: bool = False  # ggml_repeat(a, b) returned `a` when the shapes matched
    llama_metadata_bytes: int = 0  # llama.cpp's compute-buffer metadata added to the printed total
    leafs_first: bool = False  # every data-less leaf is allocated before the first node (2025-09 on)
    ggml_versions: tuple = ()  # (first, last) ggml_version() known to carry this allocator (for recordings)

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
            best_fit_skips_last=False, parse_seq="reorder", inplace_ops=inplace_on("2023-08-16"), max_free_blocks=128,
            view_parent_returns=True, assert_line=131, presets=True, llama_names="pre-gguf",
            repeat_returns_same_shape=True, llama_metadata_bytes=1_409_744,
            description="legacy ggml_allocr: best fit over all free blocks (the 70B Metal failure)",
        ),
        Profile(
            name="ggml-2023-08-22", commit="f03d74aa2eae3d21d3ab906ba27013eae1fa625e", family="legacy",
            best_fit_skips_last=True, parse_seq="reorder", inplace_ops=inplace_on("2023-08-22"), max_free_blocks=128,
            view_parent_returns=True, assert_line=139, presets=True, repeat_returns_same_shape=True,
            llama_metadata_bytes=1_475_280,
            description="the last-block fallback of PR #2639 with parse_seq still a pure reorder: frees are "
                        "immediate while Metal runs a level concurrently (what PR #2757 fixed)",
        ),
        Profile(
            name="ggml-2023-08-28", commit="ea9193f066e77a2019d9cd07fcaa7046ecd1e8ed", family="legacy",
            best_fit_skips_last=True, parse_seq="barrier", inplace_ops=inplace_on("2023-08-28"), max_free_blocks=128,
            view_parent_returns=False, assert_line=140, other_assert_lines=(173, 174), presets=True,
            llama_metadata_bytes=1_475_280,
            description="PR #2639 last-block fallback; parse_seq barriers defer frees (PR #2757)",
        ),
        Profile(
            name="ggml-2023-10", commit="08d748b2", family="legacy",
            best_fit_skips_last=True, parse_seq="barrier", inplace_ops=inplace_on("2023-10-30"), max_free_blocks=256,
            view_parent_returns=False, assert_line=148, other_assert_lines=(116, 114), log_style="addr",
            alignments=(64, 32, 16), backend_alignment=64, backend_slack=64,
            description="Oct 2023 - Jan 2024: the first ggml_tallocr / ggml_gallocr split (the scheduler); the "
                        "same free-block rules, messages with heap addresses, no graph markers",
        ),
        Profile(
            name="ggml-2024-02", commit="5070f078", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=inplace_on("2024-02-11"), max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=64, log_style="offset", buffer_pad=64,
            description="gallocr v3: one offset-based ggml_dyn_tallocr, reserve once; the CPU buffer type "
                        "allocates max_size + 64",
        ),
        Profile(
            name="ggml-2025-09", commit="058c3973", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=inplace_on("2025-09-23"), max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=32, log_style="offset",
            leafs_first=True,
            description="the last gallocr before chunks: all data-less leafs first, CPU alignment 32, "
                        "buffer = max_size",
        ),
        Profile(
            name="ggml-2026-08-21", commit="d99724f2b141fed9e1a9f402213506c081433465", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=inplace_on("2026-08-21"), max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=32, log_style="chunk",
            reserve_fn="ggml_gallocr_reserve_n_impl", ggml_versions=("0.9.2", "0.21.0"),
            leafs_first=True,
            description="ggml 0.21.0 (the allocator of ggml-python's 0.15.3): chunked dynamic allocator, reuse "
                        "factor, outputs kept; CLAMP is a view of its source",
        ),
        Profile(
            name="ggml-head", commit="0c1e5709 (llama.cpp)", family="gallocr",
            best_fit_skips_last=True, parse_seq="none", inplace_ops=inplace_on("2026-08-24"), max_free_blocks=256,
            view_parent_returns=False, assert_line=0, alignment=32, log_style="chunk",
            reserve_fn="ggml_gallocr_reserve_n_impl",
            leafs_first=True,
            description="ggml 0.25.3 as llama.cpp vendors it: as ggml-2026-08-21, and CLAMP (a node of its own "
                        "since llama.cpp #27644, the MoE weight normalisation) reuses its parent in place",
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


def _version(v: str) -> tuple:
    try:
        return tuple(int(x) for x in v.split("."))
    except ValueError:
        return ()


def profile_for_version(version: str) -> str:
    """The generation a recorded ggml_version() names: the row whose known releases hold it, else
    ggml-head (versions after the last known release of an older row are taken to be the newest)."""
    v = _version(version)
    for p in PROFILES.values():
        if v and p.ggml_versions and _version(p.ggml_versions[0]) <= v <= _version(p.ggml_versions[1]):
            return p.name
    return "ggml-head"


def names(presets_only: bool = False) -> str:
    """The generations for help texts and messages: "a, b, c"."""
    return ", ".join(PRESET_PROFILES if presets_only else PROFILES)
