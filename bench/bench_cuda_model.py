"""Benchmark the CUDA caching-allocator model on a ~1M-entry trace.

The requests of a real snapshot (default: the GPT-2 batch-8 training fixture, 10k entries) are repeated with
addresses moved per copy, and each copy frees what it left allocated, until about `--entries` entries. Then:
  1. what-if: the requests alone under the default settings (what `alloctrace whatif` runs twice);
  2. the model's own trace of that run (every segment, address and free) is replayed and checked entry by entry
     (what the importer runs), which must come out consistent.

    python bench/bench_cuda_model.py [--entries 1000000] [--snapshot tests/data/torch/gpt2_train_bs8.pickle.gz]
"""
from __future__ import annotations

import argparse
import gc
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from alloctrace.allocator.cuda_caching import (
    ALLOC, FREE_COMPLETED, FREE_REQUESTED, AllocatorSettings, CachingAllocator)
from alloctrace.traces import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.store.torch_stored import device_columns
from alloctrace.traces.whatif.torch_model import SimulatedDevice, replay_check, what_if

ROOT = Path(__file__).resolve().parent.parent


def repeated_requests(cols: dict, entries: int) -> dict:
    """Alloc/free requests of `cols`, copied until about `entries` entries; each copy frees its leftovers."""
    a, addr, size, stream = (np.asarray(cols[k]) for k in ("action", "addr", "size", "stream"))
    keep = (a == ALLOC) | (a == FREE_REQUESTED) | (a == FREE_COMPLETED)
    a, addr, size, stream = a[keep], addr[keep], size[keep], stream[keep]
    live = {}
    for i in range(len(a)):
        if a[i] == ALLOC:
            live[int(addr[i])] = (int(size[i]), int(stream[i]))
        elif a[i] == FREE_REQUESTED:
            live.pop(int(addr[i]), None)
    tail = [(code, ad, sz, st) for ad, (sz, st) in live.items() for code in (FREE_REQUESTED, FREE_COMPLETED)]
    ta = np.array([t[0] for t in tail], dtype=np.int8)
    tad, tsz, tst = (np.array([t[k] for t in tail], dtype=np.int64) for k in (1, 2, 3))
    one = {"action": np.concatenate([a, ta]), "addr": np.concatenate([addr, tad]),
           "size": np.concatenate([size, tsz]), "stream": np.concatenate([stream, tst])}
    copies = max(1, round(entries / len(one["action"])))
    return {"action": np.tile(one["action"], copies),
            "addr": np.concatenate([one["addr"] + (k << 44) for k in range(copies)]),
            "size": np.tile(one["size"], copies), "stream": np.tile(one["stream"], copies)}


def model_trace(req: dict, settings: AllocatorSettings) -> dict:
    """The trace the model itself writes for these requests (a real run's trace would look the same)."""
    m = CachingAllocator(settings, SimulatedDevice(settings.device_total))
    live = {}
    a, addr, size, stream = (req[k].tolist() for k in ("action", "addr", "size", "stream"))
    for i in range(len(a)):
        if a[i] == ALLOC:
            live[addr[i]] = m.malloc(size[i], stream[i])
        elif a[i] == FREE_REQUESTED:
            m.free(live.pop(addr[i]))
    log = np.array(m.log, dtype=np.int64)
    return {"action": log[:, 0].astype(np.int8), "addr": log[:, 1], "size": log[:, 2], "stream": log[:, 3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--snapshot", default=str(ROOT / "tests/data/torch/gpt2_train_bs8.pickle.gz"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:          # the snapshot as the store holds it
        store = open_store(tmp)
        [tid] = import_paths(store, [Path(args.snapshot)])
        cols = device_columns(store, tid, 0)
        store.close()
    req = repeated_requests(cols, args.entries)
    settings = AllocatorSettings()
    gc.disable()
    def timed(fn, *a, **kw):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*a, **kw)
        return out, time.perf_counter() - w, time.process_time() - c

    n = len(req["action"])
    r, wall, cpu = timed(what_if, req, settings)
    print(f"what-if: {n:,} request entries in {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"({n / cpu / 1e3:.0f}k entries per CPU second); peak reserved {r.peak_reserved:,} B")
    r, wall, cpu = timed(what_if, req, AllocatorSettings(expandable_segments=True))
    print(f"what-if, expandable segments: {wall:.2f} s wall, {cpu:.2f} s CPU; peak reserved {r.peak_reserved:,} B")
    trace = model_trace(req, settings)
    c, wall, cpu = timed(replay_check, trace, settings)
    m = len(trace["action"])
    print(f"checked replay: {m:,} trace entries in {wall:.2f} s wall, {cpu:.2f} s CPU "
          f"({m / cpu / 1e3:.0f}k entries per CPU second); consistent={c.consistent}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if not c.consistent:
        raise SystemExit(f"inconsistent: {c.mismatch}")


if __name__ == "__main__":
    main()
