"""Record real PyTorch CUDA memory snapshots of one training workload under each allocator setting, plus a
snapshot with C++ frames (stacks="all", with torch's default symbolizer and with TORCH_SYMBOLIZE_MODE=dladdr) and
two whose ring buffer wrapped (max_entries small; one of them under the cap, with its OOM).

Needs a CUDA GPU and torch. Each run is a fresh process (PYTORCH_CUDA_ALLOC_CONF is read once):

    python bench/record_torch_pairs.py OUTDIR [NAME ...]

writes OUTDIR/<name>.pickle.gz (what torch.cuda.memory._snapshot() returned, pickle protocol 4, gzip) and
OUTDIR/<name>.json (max_memory_reserved/allocated, retries, OOMs, the settings and the cap in bytes).
The workload: a 6-layer transformer encoder (d_model 1024, ff 4096, vocab 8192), AdamW, 5 steps whose batch
and sequence lengths change (8x512, 12x384, 6x640, 16x256, 10x512): the allocator's cache fragments as the
shapes change. The default run goes first; the cap of the capped runs is set between its peak allocated and
its peak reserved, so the cap forces releases and retries without an OOM.
"""
from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import time

SETTINGS = {
    "train_default": "",
    "train_expandable": "expandable_segments:True",
    "train_maxsplit": "max_split_size_mb:128",
    "train_roundup": "roundup_power2_divisions:4",
    "train_gc_cap": "garbage_collection_threshold:0.6",
    "train_cap": "",
}
EXTRA = {"train_wrapped": "", "mlp_stacks_all": "", "mlp_stacks_dladdr": "", "train_cap_wrapped": ""}
ENV = {"mlp_stacks_dladdr": {"TORCH_SYMBOLIZE_MODE": "dladdr"}}   # the symbolizer that names objects, not functions
CAPPED = ("train_gc_cap", "train_cap", "train_cap_wrapped")
WRAP = {"train_wrapped": 4000, "train_cap_wrapped": 3000}
SHAPES = [(8, 512), (12, 384), (6, 640), (16, 256), (10, 512)]


def train(torch, steps=SHAPES):
    torch.manual_seed(0)
    nn = torch.nn
    layer = nn.TransformerEncoderLayer(1024, 16, 4096, dropout=0.0, batch_first=True)
    model = nn.Sequential()
    emb = nn.Embedding(8192, 1024).cuda()
    enc = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).cuda()
    head = nn.Linear(1024, 8192).cuda()
    params = list(emb.parameters()) + list(enc.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    for b, s in steps:
        tok = torch.randint(0, 8192, (b, s), device="cuda")
        logits = head(enc(emb(tok)))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 8192), tok.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del tok, logits, loss
    torch.cuda.synchronize()


def mlp(torch):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(64, 256, device="cuda")
        m(x).sum().backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()


def child(name: str, outdir: str, cap: int | None):
    import torch
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    stacks, entries = ("all", 100_000) if name.startswith("mlp_stacks") else ("python", WRAP.get(name, 1_000_000))
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=entries)
    t0 = time.time()
    oom = None
    try:
        mlp(torch) if name.startswith("mlp_stacks") else train(torch)
    except torch.OutOfMemoryError as e:
        oom = str(e)[:400]
    snap = torch.cuda.memory._snapshot()
    stats = torch.cuda.memory_stats()
    side = dict(name=name, config={**SETTINGS, **EXTRA}[name], env=ENV.get(name), torch=torch.__version__,
                device=torch.cuda.get_device_name(0), device_total_memory=total, cap_bytes=cap,
                allowed_bytes=int(cap / total * total) if cap else None,
                record=dict(enabled="all", context="all", stacks=stacks, max_entries=entries),
                max_memory_reserved=torch.cuda.max_memory_reserved(),
                max_memory_allocated=torch.cuda.max_memory_allocated(),
                memory_reserved=torch.cuda.memory_reserved(), memory_allocated=torch.cuda.memory_allocated(),
                num_alloc_retries=stats.get("num_alloc_retries"), num_ooms=stats.get("num_ooms"),
                requested_peak=stats.get("requested_bytes.all.peak"),
                num_device_alloc=stats.get("num_device_alloc"), num_device_free=stats.get("num_device_free"),
                entries=len(snap["device_traces"][0]), seconds=round(time.time() - t0, 2), oom=oom)
    with gzip.open(os.path.join(outdir, f"{name}.pickle.gz"), "wb", compresslevel=6) as f:
        f.write(pickle.dumps(snap, protocol=4))
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump(side, f, indent=1)
    print(json.dumps(side), flush=True)


def spawn(name, outdir, cap=None):
    conf = {**SETTINGS, **EXTRA}[name]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    env.update(ENV.get(name, {}))
    return subprocess.Popen([sys.executable, __file__, outdir, "child", name, str(cap or 0)], env=env)


def main():
    if len(sys.argv) == 5 and sys.argv[2] == "child":
        child(sys.argv[3], sys.argv[1], int(sys.argv[4]) or None)
        return
    outdir, only = sys.argv[1], sys.argv[2:]
    os.makedirs(outdir, exist_ok=True)
    names = only or [*SETTINGS, "train_wrapped", "mlp_stacks_all"]
    first = [spawn("train_default", outdir)] + [spawn(n, outdir) for n in names if n not in CAPPED
                                                 and n != "train_default"]
    first[0].wait()
    d = json.load(open(os.path.join(outdir, "train_default.json")))
    cap = (d["max_memory_allocated"] + d["max_memory_reserved"]) // 2 >> 21 << 21      # a multiple of 2 MiB
    rest = [spawn(n, outdir, cap) for n in names if n in CAPPED]
    for p in first[1:] + rest:
        p.wait()


if __name__ == "__main__":
    main()
