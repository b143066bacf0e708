"""Record small real PyTorch CUDA memory snapshots of one workload under several allocator settings.

Needs a CUDA GPU and torch. Each setting runs in a fresh process (PYTORCH_CUDA_ALLOC_CONF is read once):

    python bench/record_torch_snapshots.py OUTDIR [capped]

writes OUTDIR/small_<name>.pickle.gz (what torch.cuda.memory._snapshot() returned, pickled with protocol 4 and
gzip'd) and OUTDIR/small_<name>.json (max_memory_reserved/allocated, the retry/OOM counters, the settings).
The workload is deterministic: a few hundred allocations of mixed sizes, half freed, then slightly larger ones
(the batch N -> N+1 pattern that fragments the cache), a burst of big tensors, and a few matrix products.
`capped` records the second group instead: every setting under a 2 GiB cap, with a workload that runs into it
(each OOM caught: a third of what is held is dropped and the loop goes on), an empty_cache() half way and one at
the end: releases before retries, unmapping of expandable segments, oversize-block releases, the GC, OOMs.
"""
from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import subprocess
import sys

CONFIGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit": "max_split_size_mb:40",
    "roundup": "roundup_power2_divisions:4",
    "gc": "garbage_collection_threshold:0.6",     # with a memory fraction (the GC only runs under one)
    "streams": "",                                # default settings, with a side stream and record_stream
    "roundlist": "roundup_power2_divisions:[1:8,>:2]",   # per interval: below 1 MiB uses the first one (2.8+)
}
FRACTION_BYTES = {"gc": 6 << 30}
CAPPED = {
    "cap_default": "",
    "cap_expandable": "expandable_segments:True",
    "cap_maxsplit": "max_split_size_mb:40",
    "cap_gc": "garbage_collection_threshold:0.5",
    "cap_expandable_streams": "expandable_segments:True",
    "cap_expandable_maxsplit": "expandable_segments:True,max_split_size_mb:40",
    "cap_expandable_gc": "expandable_segments:True,garbage_collection_threshold:0.5",
}
CAP = 2 << 30


def capped(torch, rng: random.Random, *, streams: bool):
    held = []

    def new(nb):
        try:
            return torch.empty(nb, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            rng.shuffle(held)
            del held[: len(held) // 3]
            return None

    side = torch.cuda.Stream() if streams else None
    for i in range(400):
        if i == 200:
            torch.cuda.empty_cache()
        r = rng.random()
        n = rng.randint(1 << 10, 1 << 20) if r < 0.3 else rng.randint(1 << 20, 10 << 20) if r < 0.7 else \
            rng.randint(30 << 20, 120 << 20)
        if side is not None and i % 5 == 0:
            with torch.cuda.stream(side):
                t = new(n)
        else:
            t = new(n)
        if t is not None:
            held.append(t)
        if held and rng.random() < 0.25:
            held.pop(rng.randrange(len(held)))
    held.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def workload(torch, rng: random.Random, *, streams: bool):
    dev = "cuda"
    held = []

    def new(nbytes):
        return torch.empty(nbytes, dtype=torch.uint8, device=dev)

    for i in range(240):
        r = rng.random()
        if r < 0.4:
            n = rng.randint(1 << 10, 1 << 20)
        elif r < 0.8:
            n = rng.randint(1 << 20, 10 << 20)
        else:
            n = rng.randint(10 << 20, 64 << 20)
        held.append(new(n))
    rng.shuffle(held)
    del held[: len(held) // 2]
    grown = [new(int(t.numel() * 1.15) + 4096) for t in held[:80]]
    del held[::3]
    big = [new(rng.randint(100 << 20, 300 << 20)) for _ in range(6)]
    del big[1::2]
    if streams:
        side = torch.cuda.Stream()
        for _ in range(20):
            x = new(rng.randint(1 << 20, 8 << 20))
            with torch.cuda.stream(side):
                y = new(rng.randint(1 << 10, 1 << 20))
                x.record_stream(side)
                y.fill_(1)
            del x, y
    a = torch.randn(2048, 2048, device=dev)
    for _ in range(3):
        a = (a @ a).relu() / 2048
    del grown, big, held
    torch.cuda.synchronize()


def child(name: str, outdir: str):
    import torch
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    limit = CAP if name in CAPPED else FRACTION_BYTES.get(name)
    if limit:
        torch.cuda.set_per_process_memory_fraction(limit / total)
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=100_000)
    try:
        if name in CAPPED:
            capped(torch, random.Random(1), streams=name.endswith("streams"))
        else:
            workload(torch, random.Random(0), streams=(name == "streams"))
    except torch.OutOfMemoryError as e:                 # keep the snapshot: the OOM is part of it
        print(name, "OOM:", str(e)[:120])
    snap = torch.cuda.memory._snapshot()
    stats = torch.cuda.memory_stats()
    side = dict(config={**CONFIGS, **CAPPED}[name], torch=torch.__version__, device_total_memory=total, limit_bytes=limit,
                allowed_bytes=int(limit / total * total) if limit else None,   # the allocator's own double math
                max_memory_reserved=torch.cuda.max_memory_reserved(),
                max_memory_allocated=torch.cuda.max_memory_allocated(),
                num_alloc_retries=stats.get("num_alloc_retries"), num_ooms=stats.get("num_ooms"))
    raw = pickle.dumps(snap, protocol=4)
    with gzip.open(os.path.join(outdir, f"small_{name}.pickle.gz"), "wb", compresslevel=9) as f:
        f.write(raw)
    with open(os.path.join(outdir, f"small_{name}.json"), "w") as f:
        json.dump(side, f, indent=1)
    print(name, side)


def main():
    if len(sys.argv) == 4:
        child(sys.argv[3], sys.argv[1])
        return
    outdir = sys.argv[1]
    group = CAPPED if sys.argv[2:] == ["capped"] else CONFIGS
    os.makedirs(outdir, exist_ok=True)
    for name, conf in group.items():
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else \
            {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
        subprocess.run([sys.executable, __file__, outdir, "child", name], env=env, check=True)


if __name__ == "__main__":
    main()
