"""Many ranks: per-rank PyTorch snapshots of one distributed job as one trace (a device row per rank); the ranks side by
side are diff/torch_ranks.py.

Each rank's file is read in full through the same bounded reader as any import (nothing is stored until
every file has been read). A rank is known from the recorder's `.json` beside the pickle, else from a
`rank<N>` in the file name, else from the files' order. Of each rank's devices the one that holds its
entries is kept (a rank on cuda:1 writes an empty trace for cuda:0 too).
"""
from __future__ import annotations

import json
import os
import re
import stat
from alloctrace.allocator.record_class import replace
from pathlib import Path

from alloctrace.traces.errors import UserError

SNAPSHOT_SUFFIXES = (".pickle", ".pickle.gz", ".pickle.zst", ".pickle.xz", ".pkl", ".pkl.gz")
RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)
MAX_RANKS = 4096
SIDECAR_MAX = 64 * 1024


def snapshot_files(directory: Path) -> list[Path]:
    """The snapshot pickles of a directory (not recursive), refused with one line when there are none."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(SNAPSHOT_SUFFIXES))
    if not files:
        raise UserError(f"{directory}: no snapshot files (*.pickle, *.pickle.gz, .zst, .xz) in this directory")
    if len(files) > MAX_RANKS:
        raise UserError(f"{directory}: {len(files):,} snapshot files; at most {MAX_RANKS:,} ranks")
    return files


def rank_of(path: Path, position: int) -> int:
    """The recorder's sidecar `rank`, else `rank<N>` in the name, else the file's position."""
    stem = path.name.split(".pickle")[0].split(".pkl")[0]
    facts = _sidecar(path.with_name(stem + ".json"))
    if isinstance(facts, dict) and isinstance(facts.get("rank"), int):
        return facts["rank"]
    m = RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else position


def _sidecar(path: Path):
    """The recorder's `.json` beside a pickle, or None. Opened without blocking and read only when it is a
    regular file: a FIFO of that name (another user's, in a shared folder) hung `import DIR` forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            return json.loads(f.read(SIDECAR_MAX))  # the recorder's is ~200 bytes; anything longer is not it
        except (OSError, ValueError, UnicodeDecodeError):
            return None


def read_ranks(paths: list[Path], *, name: str | None = None, limits=None):
    """All ranks' files as one ImportedTrace: graph index = rank order, `extra.rank` = the rank."""
    from alloctrace.traces.sources import read_file

    from alloctrace.traces.sources.torch.source import NAME

    ranked = sorted(((rank_of(p, i), p) for i, p in enumerate(paths)), key=lambda rp: (rp[0], str(rp[1])))
    ranks = [r for r, _ in ranked]
    if len(set(ranks)) != len(ranks):
        dup = next(r for r in ranks if ranks.count(r) > 1)
        raise UserError(f"rank {dup} appears in more than one file; name the files of one run only")
    graphs, report = [], []
    for rank, path in ranked:
        traces = read_file(path, limits=limits)
        if len(traces) != 1 or traces[0].meta.source != NAME:
            raise UserError(f"{path.name}: not a PyTorch memory snapshot")
        t = traces[0]
        devs = list(t.graphs)
        used = [g for g in devs if g.n_events or g.extra.get("n_segments")] or devs[:1]
        by_device = {d["device"]: d for d in t.report.get("devices", [])}
        for g in used:
            extra = {**g.extra, "rank": rank, "cuda_device": g.index, "file": path.name}
            graphs.append(replace(g, index=len(graphs), extra=extra))
            report.append({**by_device.get(g.index, {}), "device": len(graphs) - 1, "rank": rank,
                           "cuda_device": g.index, "file": path.name})
    first = Path(paths[0])
    meta = replace(t.meta, name=name or (first.parent.name if len(paths) > 1 else first.name),
                   extra={"format": "torch-snapshot", "ranks": len(ranked), "devices": len(graphs),
                          "files": [p.name for _, p in ranked]})
    return type(t)(meta=meta, graphs=graphs, report={"devices": report, "ranks": len(ranked)})


def import_ranks(store, paths, *, name: str | None = None, limits=None, tags=()) -> list[dict]:
    """Read every rank, then store the one trace (one transaction): its summary, as `import_files` answers;
    `tags` (key=value) are added to the trace's own."""
    from alloctrace.traces.sources.logio import check_path
    from alloctrace.traces.sources import store_traces

    files: list[Path] = []
    for p in map(Path, paths):
        files += snapshot_files(p) if p.is_dir() else [check_path(p)]
    if not files:
        raise UserError("no snapshot files to import")
    trace = read_ranks(files, name=name, limits=limits)
    if tags:
        from alloctrace.traces.store.tags import with_tags
        trace.meta.tags = with_tags(trace.meta.tags, tags)
    return store_traces(store, [trace])
