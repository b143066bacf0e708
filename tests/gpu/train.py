"""A small real training job for recording on a GPU (the record hook's check on real torch): a 4-layer
transformer language model, AdamW, fp32. Writes the allocator's own counters to --truth after every step."""
import argparse
import json
import os

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5, help="-1: until killed")
p.add_argument("--batch", type=int, default=32)
p.add_argument("--cap-gib", type=float, default=None, help="set_per_process_memory_fraction to this many GiB")
p.add_argument("--truth", required=True)
p.add_argument("--ready", default=None, help="write the pid here after step 2")
args = p.parse_args()

dev = torch.device("cuda")
if args.cap_gib:
    torch.cuda.set_per_process_memory_fraction(args.cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory)
VOCAB, WIDTH, SEQ = 8192, 512, 256
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, WIDTH),
                      nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, 8, 4 * WIDTH, batch_first=True), 4),
                      nn.Linear(WIDTH, VOCAB)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def truth(step):
    s = torch.cuda.memory_stats()
    keep = {k: v for k, v in s.items() if k.startswith(("allocated_bytes.all.", "reserved_bytes.all.",
                                                       "requested_bytes.all.", "segment.all.")) or
            k in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")}
    out = {"step": step, "max_memory_allocated": torch.cuda.max_memory_allocated(),
           "max_memory_reserved": torch.cuda.max_memory_reserved(), "memory_allocated": torch.cuda.memory_allocated(),
           "memory_reserved": torch.cuda.memory_reserved(), "memory_stats": keep, "torch": torch.__version__,
           "batch": args.batch, "cap_gib": args.cap_gib}
    with open(args.truth + ".part", "w") as f:
        json.dump(out, f, indent=1)
    os.replace(args.truth + ".part", args.truth)


step = 0
try:
    while args.steps < 0 or step < args.steps:
        x = torch.randint(0, VOCAB, (args.batch, SEQ), device=dev)
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        truth(step)
        if args.ready and step == 2:
            with open(args.ready, "w") as f:
                f.write(str(os.getpid()))
        step += 1
finally:
    truth(step)
