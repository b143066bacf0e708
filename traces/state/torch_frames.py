"""Which frame of a stack is its call site.

Snapshots recorded with `stacks="all"` (what `_record_memory_history()` does by default) interleave C++ frames
(the allocator, the dispatcher, the interpreter's eval loop, libc) with the Python ones. A native frame says where
the bytes were asked for inside torch, never in the user's program, so it is never the call site while the stack
has a Python frame: the site is the first Python frame outside `skip` (torch's own files by default), else the
program's own code without a file (`<string>` of exec or `python -c`), else the innermost Python frame. A
stack with C++ frames only (the autograd engine's thread) is named by its autograd node (`AddmmBackward0`) when
it has one, else by its first native frame outside the interpreter, libc, libtorch and the CUDA libraries; when
every frame is one of those, it has no call site of its own (the caller then names it by the annotation around
it, as for entries without frames).
"""
from __future__ import annotations

import re

DEFAULT_SKIP = ("site-packages/torch/", "dist-packages/torch/", "site-packages\\torch\\", "<frozen ",
                "<built-in", "<string>")  # Python frames whose file name contains one of these are torch's own
# the program's code without a file of its own (exec'd text, `python -c`, a REPL): skipped for a caller with a
# file, but still the program's own when every other Python frame is torch's
NO_FILE = ("<string>", "<stdin>", "<console>")

# native frames: shared objects and binaries (file name parts, for symbolizers that give the object) ...
NATIVE_FILES = ("/python2", "/python3", "libpython", "libc.so", "libc-", "ld-linux", "libstdc++", "libgcc_s",
                "libpthread", "libm.so", "libdl.so", "libtorch", "libc10", "libshm", "_C.cpython", "_C.so",
                "libcuda", "libcudart", "libcublas", "libcudnn", "libnccl", "libnvrtc", "libcusparse", "libcufft",
                "libcurand", "libcusolver", "libnvToolsExt", "libnvJitLink", "libcupti", "libnvidia", "libnvshmem")
# ... and function names (for symbolizers that give the name and a source file)
NATIVE_NAMES = re.compile(
    r"^(?:\?\?|_?Py|_start\b|__libc|__clone|clone\d*$|start_thread|pthread_|cu[A-Z]|cuda[A-Z_]|THP|"
    r"(?:[\w:<>,&*]+\s+)?(?:c10|c10d|at|torch|caffe2|pybind11|std|__gnu_cxx|__cxxabiv1)::)")
AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\b")


def parse_skip(text: str | None) -> tuple[str, ...]:
    """`--skip` / `?skip=`: comma-separated file-name parts; the word `default` stands for DEFAULT_SKIP, so
    `default,mypkg/` refines the default set and `mypkg/` replaces it."""
    if text is None:
        return DEFAULT_SKIP
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part == "default":
            out += DEFAULT_SKIP
        elif part:
            out.append(part)
    return tuple(out)


def is_python(frame: dict) -> bool:
    f = frame["filename"]
    return f.endswith((".py", ".pyw", ".pyx")) or (f.startswith("<") and f.endswith(">"))


def is_native_noise(frame: dict, skip=()) -> bool:
    """A C++ frame of the interpreter, libc, libtorch or a CUDA library (or matching `skip`)."""
    f, name = frame["filename"], frame["name"]
    return (bool(NATIVE_NAMES.match(name)) or any(p in f for p in NATIVE_FILES)
            or any(p and (p in f or p in name) for p in skip))


def call_site(frames: list[dict], skip=DEFAULT_SKIP) -> tuple[dict | None, str]:
    """(the frame that names the stack, its kind: "python" | "autograd" | "native"), or (None, "") when no
    frame does (no frames, or native ones of the runtime only)."""
    python = [f for f in frames if is_python(f)]
    if python:
        pick = next((f for f in python if not any(p in f["filename"] for p in skip)), None)
        if pick is None:    # exec'd code with no caller outside torch: that code, never a frame inside torch
            pick = next((f for f in python if f["filename"].startswith(NO_FILE)), python[0])
        return pick, "python"
    for f in frames:
        m = AUTOGRAD_NODE.search(f["name"])
        if m:
            return {"name": m.group(1), "filename": "autograd", "line": 0}, "autograd"
    pick = next((f for f in frames if not is_native_noise(f, skip)), None)
    return (pick, "native") if pick is not None else (None, "")


def site_label(frames: list[dict], skip=DEFAULT_SKIP) -> str | None:
    """The call site as a label (`name (file:line)`), None when the stack has none."""
    pick, kind = call_site(frames, skip)
    if pick is None:
        return None
    if kind == "autograd":
        return f"{pick['name']} (autograd, no Python stack)"
    if kind == "native":
        return f"{pick['name']} ({pick['filename'] or '??'})"
    return f"{pick['name']} ({short(pick['filename'])}:{pick['line']})"


def short(filename: str) -> str:
    """A file name from its package down (after site-packages/), for labels."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return filename
