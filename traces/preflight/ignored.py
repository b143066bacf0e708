"""Flags a CPU build of llama.cpp takes and ignores (-ngl, -ts, -ot, -mg, -sm): named in a sweep's or fit's
answer instead of being folded silently into points that cannot differ.

A build is taken as CPU-only when a point's program said so in llama.cpp's words ("no usable GPU found", printed
whenever -ngl is given to a build without a GPU backend), or when every point that made compute buffers made
them on the CPU only: a GPU backend makes a compute buffer of its own (CUDA0, Metal, Vulkan0, ...) even with
-ngl 0.
"""
from __future__ import annotations

GPU_FLAGS = ("-ngl", "--n-gpu-layers", "--gpu-layers", "-ts", "--tensor-split", "-ot", "--override-tensor",
             "-mg", "--main-gpu", "-sm", "--split-mode")
NO_GPU = "no usable GPU found"  # llama.cpp's own warning, given -ngl on a build without a GPU backend


def said_no_gpu(text: str) -> bool:
    return NO_GPU in text


def gpu_flags(argv: list[str], varied: list[str]) -> list[str]:
    """The GPU-only flags given in `argv` (FLAG VALUE or FLAG=VALUE) or varied, in the order first seen."""
    seen = [w.partition("=")[0] for w in argv[1:]] + list(varied)
    return list(dict.fromkeys(f for f in seen if f in GPU_FLAGS))


def cpu_only(points: list[dict]) -> str | None:
    """Why these points ran on a CPU-only build (`no_gpu` said, or every compute buffer on the CPU), else None."""
    if any(p.get("no_gpu") for p in points):
        return f"the program said '{NO_GPU}'"
    made = [p for p in points if p.get("buffers")]
    if made and all(b.upper().startswith("CPU") for p in made for b in p["buffers"]):
        return "every compute buffer was made on the CPU"
    return None


def ignored(points: list[dict], argv: list[str], varied: list[str]) -> dict | None:
    """{"flags", "why", "identical", "message"} when GPU-only flags were given to a CPU-only build, else None.
    `identical`: every varied flag is one of them and the points that ran made the same buffers (None when
    something else is varied too, or fewer than two points ran)."""
    flags = gpu_flags(argv, varied)
    why = cpu_only(points) if flags else None
    if why is None:
        return None
    message = f"ignored by this CPU build: {', '.join(flags)} ({why})"
    identical = None
    ran = [p for p in points if p.get("buffers")]
    if varied and all(f in GPU_FLAGS for f in varied) and len(ran) > 1:
        identical = all(p["buffers"] == ran[0]["buffers"] for p in ran)
        message += ("; the points differ only in these flags, so they are identical" if identical else
                    "; the points differ only in these flags, yet their buffers differ")
    return {"flags": flags, "why": why, "identical": identical, "message": message}
