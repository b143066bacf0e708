"""`alloctrace record` for Python programs: the environment that records PyTorch's CUDA memory history from
the program's start (hook/sitecustomize.py runs inside it), and the snapshots it leaves behind."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from alloctrace.traces.sources.torch.hook import HOOK_DIR

STACKS = ("python", "all")


@dataclass
class Snapshot:
    """One process's dump: the pickle and what the hook said about it (reason, pid, rank...)."""

    path: Path
    facts: dict

    @property
    def rank(self) -> int | None:
        r = self.facts.get("rank")
        return r if isinstance(r, int) else None


def hook_env(out_dir: Path, stacks: str = "python", max_entries: int = 1_000_000,
             environ: dict | None = None) -> dict[str, str]:
    """What to add to the program's environment: the hook first on PYTHONPATH, where to dump, how to record."""
    environ = os.environ if environ is None else environ
    path = os.pathsep.join(p for p in (str(HOOK_DIR), environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "ALLOCTRACE_TORCH_DIR": str(out_dir), "ALLOCTRACE_TORCH_STACKS": stacks,
            "ALLOCTRACE_TORCH_MAX_ENTRIES": str(max_entries)}


def snapshots_in(out_dir: Path) -> list[Snapshot]:
    """The complete dumps in `out_dir` (a `.part` left by a process killed mid-dump is not one), by rank, then pid."""
    found = []
    for p in out_dir.glob("*.pickle"):
        try:
            facts = json.loads(p.with_suffix(".json").read_text())
        except (OSError, ValueError):
            facts = {}
        found.append(Snapshot(p, facts if isinstance(facts, dict) else {}))
    return sorted(found, key=lambda s: (s.rank is None, s.rank or 0, s.facts.get("pid") or 0, s.path.name))


def nothing_recorded(out_dir: Path, ggml_too: bool) -> str:
    """Why a Python program left no snapshot, from the hook's notes: it never imported torch, or it did and
    then never used CUDA (and, when ggml was recorded as well, that it used no ggml graph allocator either)."""
    imported = any(out_dir.glob("torch-imported-pid*"))
    why = ("the program imported torch but CUDA was not available to it or it allocated nothing on the GPU"
           if imported else "the program never imported torch")
    return f"no CUDA memory was recorded: {why}" + (
        "; nor did it use ggml's graph allocator (a ggml it links statically is not seen: build ggml with "
        "-DBUILD_SHARED_LIBS=ON)" if ggml_too else "")
