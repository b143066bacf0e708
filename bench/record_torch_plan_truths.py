"""Record what the caching allocator really does for the steps of torch_plan_workloads.py (a GPU machine).

    python3 bench/record_torch_plan_truths.py OUT_DIR
    python3 bench/record_torch_plan_truths.py --more OUT_DIR         # ResNet-50 and reentrant checkpointing
    python3 bench/record_torch_plan_truths.py --variants OUT_DIR     # accumulation, checkpointing, set_to_none,
                                                                     # fp16 with a GradScaler (variants.json)
    python3 bench/record_torch_plan_truths.py --checkpoint-snapshots OUT_DIR   # snapshots of checkpointed steps

Writes OUT_DIR/truths.json: for each model x dtype x batch, `max_memory_allocated` / `max_memory_reserved` of
a fresh allocator (everything freed, cache emptied, cuBLAS workspaces dropped, peaks reset) after two training
steps, the step's wall time; for each model x dtype, the largest batch that runs two steps under a memory cap
(`set_per_process_memory_fraction`), found by bisection; the allocations one cuBLAS call makes beyond its
output (the workspaces); and OUT_DIR/NAME.pickle.gz, the memory snapshots (with Python stacks) of a few runs.
"""
from __future__ import annotations

import gc
import gzip
import json
import os
import pickle
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_plan_workloads import BATCHES, DTYPES, MODELS, VARIANTS, train, train_variant  # noqa: E402

SNAPSHOTS = {("mlp", "fp32", 256), ("gpt", "fp32", 8), ("gpt", "bf16", 8), ("vit", "bf16", 32)}


def fresh():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return {"left_allocated": torch.cuda.memory_allocated(), "left_reserved": torch.cuda.memory_reserved()}


def measure(name, batch, dtype, snapshot_path=None, **variant):
    left = fresh()
    if snapshot_path:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    t0 = time.perf_counter()
    if variant or dtype == "fp16":
        train_variant(name, batch, dtype, **variant)
    else:
        train(name, batch, dtype)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    out = {"model": name, "dtype": dtype, "batch": batch,
           "max_memory_allocated": torch.cuda.max_memory_allocated(),
           "max_memory_reserved": torch.cuda.max_memory_reserved(), "wall_s": wall, **left}
    if snapshot_path:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with gzip.open(snapshot_path, "wb") as f:
            pickle.dump(snap, f)
        out["snapshot"] = os.path.basename(snapshot_path)
    return out


def fits(name, batch, dtype):
    fresh()
    try:
        train(name, batch, dtype)
        torch.cuda.synchronize()
        return True
    except torch.OutOfMemoryError:
        return False


def largest_batch(name, dtype, fraction, hi):
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        lo, tried = 0, {hi: fits(name, hi, dtype)}
        if tried[hi]:
            return None, tried
        while lo + 1 < hi:                      # fits(lo) or lo == 0; not fits(hi)
            mid = (lo + hi) // 2
            tried[mid] = fits(name, mid, dtype)
            lo, hi = (mid, hi) if tried[mid] else (lo, mid)
        return lo, tried
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        fresh()


def workspace_probe():
    """Every allocation of one fp32 and one bf16 matmul (and addmm) after the workspaces were dropped."""
    fresh()
    a = torch.randn(64, 64, device="cuda")
    torch.cuda.memory._record_memory_history(max_entries=1000, stacks="python")
    b = a @ a
    c = torch.addmm(a, a, a)
    d = a.bfloat16() @ a.bfloat16()
    e = torch.addmm(a.bfloat16(), a.bfloat16(), a.bfloat16())
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del a, b, c, d, e
    return [{"action": e["action"], "size": e["size"], "stream": e["stream"]}
            for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested", "segment_alloc")]


def variants(out_dir):
    """Gradient accumulation, activation checkpointing and zero_grad(set_to_none=False), GPT-2-like and ViT-like."""
    out = []
    for name, batch in (("gpt", 8), ("vit", 32)):
        for dtype in DTYPES:
            for label, kw in VARIANTS.items():
                out.append(dict(measure(name, batch, dtype, **kw), variant=label))
                print(out[-1], flush=True)
    for name in MODELS:                         # fp16 autocast with a GradScaler, every batch
        for batch in BATCHES[name]:
            out.append(dict(measure(name, batch, "fp16"), variant="fp16_gradscaler"))
            print(out[-1], flush=True)
    with open(os.path.join(out_dir, "variants.json"), "w") as f:
        json.dump(out, f, indent=1)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    total = torch.cuda.get_device_properties(0).total_memory
    result = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
              "total_memory": total, "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
              "workspace_probe": workspace_probe(), "runs": [], "largest": []}
    train("mlp", 8, "fp32")                     # warm-up: kernels loaded, lazy init done
    for name in MODELS:
        for dtype in DTYPES:
            for batch in BATCHES[name]:
                snap = (os.path.join(out_dir, f"{name}_{dtype}_b{batch}.pickle.gz")
                        if (name, dtype, batch) in SNAPSHOTS else None)
                result["runs"].append(measure(name, batch, dtype, snap))
                print(result["runs"][-1], flush=True)
    for name in MODELS:
        for dtype in DTYPES:
            top = BATCHES[name][-1]
            run = next(r for r in result["runs"] if (r["model"], r["dtype"], r["batch"]) == (name, dtype, top))
            cap = int(run["max_memory_reserved"] * 1.5) // (1 << 20) * (1 << 20)
            fraction = cap / total
            value, tried = largest_batch(name, dtype, fraction, top * 8)
            result["largest"].append({"model": name, "dtype": dtype, "fraction": fraction,
                                      "cap": int(fraction * total), "value": value,
                                      "tried": {str(k): v for k, v in sorted(tried.items())}})
            print(result["largest"][-1], flush=True)
    with open(os.path.join(out_dir, "truths.json"), "w") as f:
        json.dump(result, f, indent=1)


def op_scratch(name, batch, dtype):
    """Every op of two steps on the real GPU: its new output storages and the bytes it took beyond them and
    gave back before returning (peak minus what is left after it), e.g. cuDNN's convolution workspaces."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    rows = {}

    def sig(args):
        out = []
        for a in tree_leaves(args):
            if isinstance(a, torch.Tensor):
                out.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
            elif isinstance(a, (int, float, bool)) or a is None:
                out.append(repr(a))
        return " ".join(out)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            after = torch.cuda.memory_allocated()
            peak = torch.cuda.max_memory_allocated()
            key = f"{func.__name__} {sig(args)}"
            row = rows.setdefault(key, {"op": func.__name__, "args": sig(args), "calls": 0, "scratch": 0,
                                        "grown": 0})
            row["calls"] += 1
            row["scratch"] = max(row["scratch"], peak - after)
            row["grown"] = max(row["grown"], after - before)
            return out

    fresh()
    with Mode():
        train(name, batch, dtype)
    torch.cuda.synchronize()
    fresh()
    return [r for r in rows.values() if r["scratch"]]


def more(out_dir):
    """ResNet-50 (every dtype and batch, its ops' scratch, the largest batch under a cap, one snapshot) and
    reentrant / non-reentrant activation checkpointing of the GPT-2-like and ViT-like steps (more.json)."""
    from torch_plan_workloads import RESNET_BATCHES, VARIANTS_MORE, train_checkpoint_reentrant
    import torch_plan_workloads as w
    os.makedirs(out_dir, exist_ok=True)
    total = torch.cuda.get_device_properties(0).total_memory
    result = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "device": torch.cuda.get_device_name(0), "total_memory": total,
              "cudnn_benchmark": torch.backends.cudnn.benchmark, "runs": [], "scratch": [], "largest": [],
              "variants": []}
    for dtype in DTYPES:
        for batch in RESNET_BATCHES:
            snap = os.path.join(out_dir, f"resnet50_{dtype}_b{batch}.pickle.gz") if batch == 16 else None
            result["runs"].append(measure("resnet50", batch, dtype, snap))
            print(result["runs"][-1], flush=True)
            result["scratch"].append({"model": "resnet50", "dtype": dtype, "batch": batch,
                                      "ops": op_scratch("resnet50", batch, dtype)})
    with open(os.path.join(out_dir, "more.json"), "w") as f:
        json.dump(result, f, indent=1)
    for name, batch in (("gpt", 8), ("vit", 32)):
        for dtype in DTYPES:
            for label in VARIANTS_MORE:
                left = fresh()
                t0 = time.perf_counter()
                if label == "checkpoint_reentrant":
                    train_checkpoint_reentrant(name, batch, dtype)
                else:
                    w.train_variant(name, batch, dtype, **VARIANTS_MORE[label])
                torch.cuda.synchronize()
                result["variants"].append({"model": name, "dtype": dtype, "batch": batch, "variant": label,
                                           "max_memory_allocated": torch.cuda.max_memory_allocated(),
                                           "max_memory_reserved": torch.cuda.max_memory_reserved(),
                                           "wall_s": time.perf_counter() - t0, **left})
                print(result["variants"][-1], flush=True)
    with open(os.path.join(out_dir, "more.json"), "w") as f:
        json.dump(result, f, indent=1)
    for dtype in DTYPES:
        run = next(r for r in result["runs"] if (r["dtype"], r["batch"]) == (dtype, RESNET_BATCHES[-1]))
        cap = int(run["max_memory_reserved"] * 1.5) // (1 << 20) * (1 << 20)
        value, tried = largest_batch("resnet50", dtype, cap / total, RESNET_BATCHES[-1] * 4)
        result["largest"].append({"model": "resnet50", "dtype": dtype, "fraction": cap / total,
                                  "cap": int(cap / total * total), "value": value,
                                  "tried": {str(k): v for k, v in sorted(tried.items())}})
        print(result["largest"][-1], flush=True)
        with open(os.path.join(out_dir, "more.json"), "w") as f:
            json.dump(result, f, indent=1)


CHECKPOINT_SNAPSHOTS = (("vit", "fp32", 32, "checkpoint"), ("vit", "bf16", 32, "checkpoint"),
                        ("vit", "bf16", 32, "checkpoint_reentrant"), ("gpt", "bf16", 8, "checkpoint_reentrant"))


def checkpoint_snapshots(out_dir):
    """Memory snapshots (Python stacks) of activation-checkpointed steps, NAME_DTYPE_bBATCH_VARIANT.pickle.gz,
    each from a fresh allocator as `measure` starts it; prints each step's peaks."""
    from torch_plan_workloads import VARIANTS_MORE, train_checkpoint_reentrant
    os.makedirs(out_dir, exist_ok=True)
    for name, dtype, batch, label in CHECKPOINT_SNAPSHOTS:
        fresh()
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
        if label == "checkpoint_reentrant":
            train_checkpoint_reentrant(name, batch, dtype)
        else:
            train_variant(name, batch, dtype, **VARIANTS_MORE[label])
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        path = os.path.join(out_dir, f"{name}_{dtype}_b{batch}_{label}.pickle.gz")
        with gzip.open(path, "wb") as f:
            pickle.dump(snap, f)
        print(os.path.basename(path), "max_memory_allocated", torch.cuda.max_memory_allocated(),
              "max_memory_reserved", torch.cuda.max_memory_reserved(), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--checkpoint-snapshots"]:
        train("mlp", 8, "fp32")                 # warm-up
        checkpoint_snapshots(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--more"]:
        train("mlp", 8, "fp32")                 # warm-up
        more(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--variants"]:
        train("mlp", 8, "fp32")                 # warm-up
        variants(sys.argv[2] if len(sys.argv) > 2 else "out")
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "out")
