"""The recorder library: built at install time into the package (setup.py); a build for a --ggml-include
header, or one the install lacks, goes into a fresh private folder removed when the command ends
(traces/util/cbuild.py says where a library may be loaded from)."""
from __future__ import annotations

import os
from pathlib import Path

from alloctrace.traces.util.cbuild import RECORDER_FLAGS, RECORDER_LIBS, preload_library
from alloctrace.traces.errors import UserError

SOURCE = Path(__file__).with_name("recorder.c")
# ggml_cgraph.leafs: after nodes, grads and (since the tensor lost its grad member, late 2024) grad_accs
CGRAPH_LEAFS = {True: 32, False: 40}
SYMBOLS = ("ggml_gallocr_new_n", "ggml_gallocr_alloc_graph", "ggml_gallocr_reserve_n")  # what it interposes
TENSOR_GRAD = rb"struct\s+ggml_tensor\s*\*\s*grad\s*;"  # a regular expression, compiled for --ggml-include


def find_ggml_header(path: str | os.PathLike) -> Path:
    """`--ggml-include`: a ggml.h, or a directory holding one (an include/ directory of ggml)."""
    p = Path(path)
    if p.is_dir():
        p = p / "ggml.h"
    if not p.is_file():
        raise UserError(f"--ggml-include: no ggml.h at {p}")
    return p


def recorder_library(ggml_header: Path | None = None) -> Path:
    """The path LD_PRELOAD gets: the install-time recorder, or one built now for this header (or because the
    install has none)."""
    flags = list(RECORDER_FLAGS)
    digest_extra = b""
    if ggml_header is not None:
        import re

        header = digest_extra = ggml_header.read_bytes()
        flags += ["-DAT_GGML_H", f"-DAT_CGRAPH_LEAFS={CGRAPH_LEAFS[bool(re.search(TENSOR_GRAD, header))]}",
                  "-I", str(ggml_header.parent), "-include", str(ggml_header.resolve())]
    return preload_library(SOURCE, "recorder", flags, digest_extra, RECORDER_LIBS, what="the recorder",
                           symbols=SYMBOLS)
