"""A small DDP job for recording per-rank snapshots: an MLP, SGD, 4 steps; rank r trains on batch 64*(r+1) so
the ranks' memory differs. Backend from $BACKEND (gloo by default: both ranks may share one GPU)."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--truth-dir", required=True)
args = p.parse_args()

dist.init_process_group(os.environ.get("BACKEND", "gloo"))
rank = dist.get_rank()
gpu = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
torch.cuda.set_device(gpu)
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 1024)).cuda(), device_ids=[gpu])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(4):
    x = torch.randn(64 * (rank + 1), 1024, device="cuda")
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
print(f"rank {rank} on cuda:{gpu} loss {loss.item():.4f}", flush=True)
out = {"rank": rank, "gpu": gpu, "device_count": torch.cuda.device_count(), "backend": dist.get_backend(),
       "max_memory_allocated": torch.cuda.max_memory_allocated(), "max_memory_reserved": torch.cuda.max_memory_reserved(),
       "requested_peak": torch.cuda.memory_stats().get("requested_bytes.all.peak"),
       "memory_allocated": torch.cuda.memory_allocated(), "memory_reserved": torch.cuda.memory_reserved()}
with open(os.path.join(args.truth_dir, f"truth-rank{rank}.json"), "w") as f:
    json.dump(out, f, indent=1)
dist.barrier()
dist.destroy_process_group()
