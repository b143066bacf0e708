"""Record what the caching allocator really does for the steps of torch_plan_workloads.py (a GPU machine).

    python3 bench/record_torch_plan_truths.py OUT_DIR
    python3 bench/record_torch_plan_truths.py --more OUT_DIR         # ResNet-50 and reentrant checkpointing
    python3 bench/record_torch_plan_truths.py --scratch OUT_DIR [DTYPE ...]   # ResNet-50's per-op programs,
                                                                     # every batch from 1 to 256
    python3 bench/record_torch_plan_truths.py --plain OUT_DIR        # ResNet-50's plain sequences
    python3 bench/record_torch_plan_truths.py --variants OUT_DIR     # accumulation, checkpointing, set_to_none,
                                                                     # fp16 with a GradScaler (variants.json)
    python3 bench/record_torch_plan_truths.py --checkpoint-snapshots OUT_DIR   # snapshots of checkpointed steps
    python3 bench/record_torch_plan_truths.py --segments OUT_DIR     # every point in a fresh process: peaks and
                                                                     # the segments' addresses (segments.json)
    python3 bench/record_torch_plan_truths.py --held-out OUT_DIR     # batches the plan was never checked on, and
                                                                     # two points again, fresh processes (held_out.json)
    python3 bench/record_torch_plan_truths.py --held-out-driver OUT_DIR   # more new batches, recorded after the
                                                                     # driver's address order was fitted
                                                                     # (held_out_driver.json)
    python3 bench/record_torch_plan_truths.py --not-monotone OUT_DIR   # batches around the largest under the cap
                                                                     # where fitting is not monotone
    python3 bench/record_torch_plan_truths.py --sdpa OUT_DIR [MODEL...]   # GPT, ViT, nanoGPT-like with SDPA:
                                                                     # fresh-process peaks and the attention ops'
                                                                     # own allocations (sdpa.json)
    python3 bench/record_torch_plan_truths.py --sdpa-kernels OUT_DIR   # scaled_dot_product_attention alone over a
                                                                     # grid of shapes: each op's own allocations
                                                                     # (sdpa_kernels.json)
    python3 bench/record_torch_plan_truths.py --sdpa-options OUT_DIR   # the same with dropout, masks and grouped-
                                                                     # query attention (sdpa_options.json)
    python3 bench/record_torch_plan_truths.py --fresh-variants OUT_DIR   # variants.json's and more.json's steps,
                                                                     # each in a fresh process (fresh_variants.json)

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


def op_arguments(args) -> str:
    """An op's arguments as the measured tables key them: each tensor's dtype and shape, each plain value. The
    plan looks them up by traces/preflight/torch_scratch.py's op_signature, which must give the same text (this
    script runs on a GPU machine without the package; tests/torch/test_torch_plan.py holds the two together)."""
    from torch.utils._pytree import tree_leaves

    out = []
    for a in tree_leaves(args):
        if isinstance(a, torch.Tensor):
            out.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        elif isinstance(a, (int, float, bool)) or a is None:
            out.append(repr(a))
    return " ".join(out)


def op_key(op: str, args) -> str:
    """The op's name and its arguments: a measured table's key."""
    return " ".join(filter(None, (op, op_arguments(args))))


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
    rows = {}

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            after = torch.cuda.memory_allocated()
            peak = torch.cuda.max_memory_allocated()
            key = op_key(func.__name__, args)
            row = rows.setdefault(key, {"op": func.__name__, "args": op_arguments(args), "calls": 0, "scratch": 0,
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


SCRATCH_BATCHES = tuple(range(1, 257))     # every batch a search below 256 can try: cuDNN's workspaces step


def labelled_ops(names: list):
    """A dispatch mode that labels each op's allocator events with the op ("opN", N its index in `names`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(op_key(func.__name__, args))
            torch.cuda.memory._set_memory_metadata(f"op{len(names) - 1}")
            try:
                return func(*args, **(kwargs or {}))
            finally:
                torch.cuda.memory._set_memory_metadata("")

    return Mode()


def op_programs(name, batch, dtype):
    """Two steps on the GPU with every op's allocator events labelled with the op (the allocator's per-thread
    memory metadata): the peaks, and per op signature the order of its own allocations inside the call, the
    ones it keeps (its outputs, "out") and the ones it frees before returning ("alloc" / "free" by index),
    for every op name that took scratch anywhere in the run (cuDNN's convolutions); also the whole sequence
    (action, size, op name) when asked."""
    names = []
    left = fresh()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None, stacks="python")
    with labelled_ops(names):
        train(name, batch, dtype)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peaks = {"model": name, "dtype": dtype, "batch": batch,
             "max_memory_allocated": torch.cuda.max_memory_allocated(),
             "max_memory_reserved": torch.cuda.max_memory_reserved(), **left}
    trace = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    calls: dict[int, list] = {}
    for e in trace:
        label = e.get("user_metadata") or ""
        if label.startswith("op"):
            calls.setdefault(int(label[2:]), []).append(e)
    programs: dict[str, list] = {}
    took = set()
    for n in sorted(calls):
        prog = call_program(calls[n])
        programs.setdefault(names[n], []).append(prog)
        if any(k == "alloc" for k, _ in prog):
            took.add(names[n].split(" ")[0])
    for n, s in enumerate(names):              # calls that allocated nothing at all
        if n not in calls:
            programs.setdefault(s, []).append([])
    kept = {}
    for s, progs in programs.items():
        if s.split(" ")[0] in took:
            kept[s] = progs[:1] if all(p == progs[0] for p in progs) else progs
    sequence = [[e["action"][:5], e["size"], names[int(e["user_metadata"][2:])].split(" ")[0]
                 if (e.get("user_metadata") or "").startswith("op") else ""] for e in trace]
    return peaks, kept, sequence


def call_program(events):
    """One op call's own allocator events -> [["out", size] | ["alloc", size] | ["free", i]]: "out" for a
    block it keeps, "alloc" for one it frees before returning (the i-th such), "free" where it does."""
    prog, pending, scratch_of = [], {}, {}
    for e in events:
        if e["action"] == "alloc":
            pending[e["addr"]] = len(prog)
            prog.append(["out", e["size"]])
        elif e["addr"] in pending:
            at = pending.pop(e["addr"])
            scratch_of[at] = len(scratch_of)
            prog[at][0] = "alloc"
            prog.append(["free", at])
    return [["free", scratch_of[v]] if k == "free" else [k, v] for k, v in prog]


def scratch_programs(out_dir, dtypes=DTYPES):
    """ResNet-50 at every batch of SCRATCH_BATCHES, in each dtype: peaks and per-op programs
    (resnet50_scratch.json.gz, rewritten after each dtype so a run cut short keeps what it did), the labelled
    sequences at batches 16, 32 and 64 (resnet50_sequences.json.gz)."""
    os.makedirs(out_dir, exist_ok=True)
    result = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "device": torch.cuda.get_device_name(0), "cudnn_benchmark": torch.backends.cudnn.benchmark,
              "runs": []}
    sequences = []
    t0 = time.perf_counter()
    for dtype in dtypes:
        for batch in SCRATCH_BATCHES:
            peaks, kept, seq = op_programs("resnet50", batch, dtype)
            result["runs"].append({**peaks, "ops": kept})
            if batch in (16, 32, 64):
                sequences.append({"dtype": dtype, "batch": batch, "sequence": seq})
            print(dtype, batch, peaks["max_memory_allocated"], peaks["max_memory_reserved"], len(kept),
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        with gzip.open(os.path.join(out_dir, "resnet50_scratch.json.gz"), "wt") as f:
            json.dump(result, f, separators=(",", ":"))
        with gzip.open(os.path.join(out_dir, "resnet50_sequences.json.gz"), "wt") as f:
            json.dump(sequences, f, separators=(",", ":"))


def plain_sequences(out_dir):
    """ResNet-50 fp32 16, 32, 64 and bf16 32 run plainly (no dispatch mode): peaks and the whole sequence
    (action, size) of alloc, free_requested and segment_alloc (resnet50_plain_sequences.json.gz)."""
    os.makedirs(out_dir, exist_ok=True)
    out = []
    for dtype, batch in (("fp32", 16), ("fp32", 32), ("bf16", 32), ("fp32", 64)):
        left = fresh()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
        train("resnet50", batch, dtype)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        seq = [[e["action"][:5], e["size"]] for e in snap["device_traces"][0]
               if e["action"] in ("alloc", "free_requested", "segment_alloc")]
        out.append({"dtype": dtype, "batch": batch, "max_memory_allocated": torch.cuda.max_memory_allocated(),
                    "max_memory_reserved": torch.cuda.max_memory_reserved(), **left, "sequence": seq})
        print(dtype, batch, out[-1]["max_memory_allocated"], out[-1]["max_memory_reserved"], len(seq), flush=True)
    with gzip.open(os.path.join(out_dir, "resnet50_plain_sequences.json.gz"), "wt") as f:
        json.dump(out, f, separators=(",", ":"))


def segment_addresses(name, dtype, batch, variant=None):
    """Two steps in this (fresh) process: the peaks and (address, size) of every segment cudaMalloc gave, in order.
    Best fit breaks ties between equal free blocks by address, so these decide the few peaks the plan misses.
    `variant`: a label of VARIANTS, VARIANTS_MORE or "fp16_gradscaler" (the step variants.json and more.json ran)."""
    from torch_plan_workloads import VARIANTS_MORE, train_checkpoint_reentrant
    fresh()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
    if variant == "checkpoint_reentrant":
        train_checkpoint_reentrant(name, batch, dtype)
    elif variant in VARIANTS_MORE or variant in VARIANTS:
        train_variant(name, batch, dtype, **{**VARIANTS, **VARIANTS_MORE}[variant])
    elif variant == "fp16_gradscaler":
        train_variant(name, batch, "fp16")
    else:
        train(name, batch, dtype)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return {"model": name, "dtype": dtype, "batch": batch, **({"variant": variant} if variant else {}),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "segments": [[e["addr"], e["size"]] for e in snap["device_traces"][0] if e["action"] == "segment_alloc"]}


# under truths.json's caps, batches on both sides of a value that does not fit below one that does
NOT_MONOTONE = (("mlp", "bf16", (4096, 4160, 4161, 4200, 4500, 5000, 5298, 5299)),
                ("vit", "bf16", (102, 103, 104, 105, 106, 107)))


def not_monotone(out_dir):
    """Whether each batch of NOT_MONOTONE runs two steps under the model's cap of truths.json (`fits`, one
    process after a warm-up, as the bisection for the largest batch ran): not_monotone.json."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "torch", "plan",
                           "truths.json")) as f:
        largest = json.load(f)["largest"]
    train("mlp", 8, "fp32")                     # warm-up
    runs = []
    for name, dtype, values in NOT_MONOTONE:
        x = next(t for t in largest if (t["model"], t["dtype"]) == (name, dtype))
        torch.cuda.set_per_process_memory_fraction(x["fraction"])
        runs.append({"model": name, "dtype": dtype, "cap": x["cap"], "fraction": x["fraction"],
                     "fits": {str(v): fits(name, v, dtype) for v in values}})
        torch.cuda.set_per_process_memory_fraction(1.0)
        print(name, dtype, runs[-1]["fits"], flush=True)
    with open(os.path.join(out_dir, "not_monotone.json"), "w") as f:
        json.dump({"recorded_with": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                    f"{torch.cuda.get_device_name(0)}", "runs": runs}, f, indent=1)


def fresh_variants(out_dir):
    """The steps of variants.json and more.json (recorded one after another in one process) again, each in a fresh
    process with its segments' addresses, as a user's run starts: fresh_variants.json."""
    import subprocess
    from torch_plan_workloads import RESNET_BATCHES, VARIANTS_MORE
    os.makedirs(out_dir, exist_ok=True)
    points = [(n, d, b, v) for n, b in (("gpt", 8), ("vit", 32)) for d in DTYPES for v in (*VARIANTS, *VARIANTS_MORE)]
    points += [(n, "fp16", b, "fp16_gradscaler") for n in MODELS if n != "resnet50" for b in BATCHES[n]]
    points += [("resnet50", d, b, None) for d in DTYPES for b in RESNET_BATCHES]
    runs = []
    for name, dtype, batch, variant in points:
        line = subprocess.run([sys.executable, os.path.abspath(__file__), "--segments-one", name, dtype, str(batch),
                               *([variant] if variant else [])], check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(line.strip().splitlines()[-1]))
        print(name, dtype, batch, variant, runs[-1]["max_memory_allocated"], runs[-1]["max_memory_reserved"],
              flush=True)
        with open(os.path.join(out_dir, "fresh_variants.json"), "w") as f:    # kept as it grows
            json.dump({"recorded_with": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                        f"{torch.cuda.get_device_name(0)}; one fresh process per point",
                       "runs": runs}, f, separators=(",", ":"))


def segments(out_dir):
    """segment_addresses for every point of main(), each in its own process (the driver's addresses depend on
    what the process mapped before): segments.json."""
    import subprocess
    os.makedirs(out_dir, exist_ok=True)
    runs = []
    for name in MODELS:
        for dtype in DTYPES:
            for batch in BATCHES[name]:
                line = subprocess.run([sys.executable, os.path.abspath(__file__), "--segments-one", name, dtype,
                                       str(batch)], check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(line.strip().splitlines()[-1]))
                print(name, dtype, batch, runs[-1]["max_memory_allocated"], runs[-1]["max_memory_reserved"],
                      flush=True)
    with open(os.path.join(out_dir, "segments.json"), "w") as f:
        json.dump({"recorded_with": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                    f"{torch.cuda.get_device_name(0)}; one fresh process per point",
                   "runs": runs}, f, separators=(",", ":"))


HELD_OUT = {"mlp": (128, 512), "gpt": (6, 12), "vit": (24, 48)}
REPEATED = (("gpt", "bf16", 8), ("vit", "fp32", 32))


# batches no recording before had, taken after the plan's driver order (torch_model.DriverAddresses) was fitted to
# segments.json and held_out.json: the check that the fit holds beyond the points it was made on
HELD_OUT_DRIVER = {"mlp": (96, 384, 768), "gpt": (5, 10, 14), "vit": (20, 40, 56), "resnet50": (24, 48)}


def held_out(out_dir, repeats=3, batches=HELD_OUT, repeated=REPEATED, name="held_out.json"):
    """segment_addresses at batches none of the other recordings used, and two points `repeats` times, each in
    a fresh process: what a plan's range over address orders must hold (held_out.json)."""
    import subprocess
    os.makedirs(out_dir, exist_ok=True)
    points = [(n, d, b) for n, bs in batches.items() for d in DTYPES for b in bs]
    runs = []
    for name_, dtype, batch in points + [p for p in repeated for _ in range(repeats)]:
        line = subprocess.run([sys.executable, os.path.abspath(__file__), "--segments-one", name_, dtype,
                               str(batch)], check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(line.strip().splitlines()[-1]))
        print(name_, dtype, batch, runs[-1]["max_memory_allocated"], runs[-1]["max_memory_reserved"], flush=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"recorded_with": f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                    f"{torch.cuda.get_device_name(0)}; one fresh process per point",
                   "runs": runs}, f, separators=(",", ":"))


def sdpa(out_dir, models=()):
    """The steps with scaled_dot_product_attention: each point in a fresh process (peaks, segments), the backend
    the dispatcher picks for each model's attention shape, and at one batch per model and dtype every attention
    op's own allocator events in order (action, size, op), to follow the fused kernels' scratch: sdpa.json."""
    import subprocess
    from torch_plan_workloads import SDPA_BATCHES, SDPA_MODELS
    os.makedirs(out_dir, exist_ok=True)
    doc = {"recorded_with": f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
                            f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}; one fresh process "
                            "per point", "runs": [], "ops": [], "choice": []}
    for name in models or SDPA_MODELS:
        for dtype in DTYPES:
            for batch in SDPA_BATCHES[name]:
                line = subprocess.run([sys.executable, os.path.abspath(__file__), "--segments-one", name, dtype,
                                       str(batch)], check=True, capture_output=True, text=True).stdout
                doc["runs"].append(json.loads(line.strip().splitlines()[-1]))
                print(name, dtype, batch, doc["runs"][-1]["max_memory_allocated"],
                      doc["runs"][-1]["max_memory_reserved"], flush=True)
    for name in models or SDPA_MODELS:
        for dtype in DTYPES:
            batch = SDPA_BATCHES[name][1]
            peaks, kept, sequence = op_programs(name, batch, dtype)
            att = [e for e in sequence if "attention" in e[2]]
            doc["ops"].append({"model": name, "dtype": dtype, "batch": batch, "peaks": peaks,
                               "programs": {k: v for k, v in kept.items() if "attention" in k},
                               "attention_events": att})
            print(name, dtype, "attention ops:", sorted({e[2] for e in att}), flush=True)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        for shape, causal in (((4, 8, 1024, 64), True), ((32, 6, 197, 64), False), ((2, 16, 512, 128), True),
                              ((2, 4, 300, 80), False), ((2, 4, 256, 256), True)):
            q = torch.randn(*shape, device="cuda", dtype=dt)
            doc["choice"].append({"dtype": str(dt).replace("torch.", ""), "shape": list(shape), "causal": causal,
                                  "backend": int(torch._fused_sdp_choice(q, q, q, is_causal=causal))})
    doc["backends"] = {"flash": torch.backends.cuda.flash_sdp_enabled(),
                       "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                       "cudnn": torch.backends.cuda.cudnn_sdp_enabled(), "math": torch.backends.cuda.math_sdp_enabled()}
    with open(os.path.join(out_dir, "sdpa.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))


SDPA_SHAPES = ((4, 8, 1024, 1024, 64), (32, 6, 197, 197, 64), (2, 16, 512, 512, 128), (2, 4, 300, 300, 80),
               (2, 4, 256, 256, 256), (3, 5, 77, 77, 32), (1, 12, 2048, 2048, 64), (2, 8, 100, 333, 64),
               (8, 4, 64, 64, 16), (2, 2, 1000, 1000, 96), (5, 3, 129, 129, 40), (2, 6, 4096, 4096, 64))


SDPA_OPTIONS = ("dropout", "bool_mask_2d", "bool_mask_4d", "float_mask_4d", "gqa")


def sdpa_case(torch, shape, dtype, option, causal, packed):
    """One case's inputs (the tests build the same on fake tensors): (the packed projection or None, q, k, v,
    scaled_dot_product_attention's keyword arguments, the gradient given to backward)."""
    b, h, tq, tk, d = shape
    x = None
    if packed:
        x = torch.randn(b, tq, 3, h, d, device="cuda", dtype=dtype, requires_grad=True)
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    else:
        q = torch.randn(b, h, tq, d, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(b, h, tk, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    kw = {"is_causal": causal}
    if option == "dropout":
        kw["dropout_p"] = 0.1
    elif option == "gqa":
        k, v = (torch.randn(b, h // 4, tk, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        kw["enable_gqa"] = True
    elif option == "bool_mask_2d":
        kw["attn_mask"] = torch.rand(tq, tk, device="cuda") > 0.2
    elif option == "bool_mask_4d":
        kw["attn_mask"] = torch.rand(b, h, tq, tk, device="cuda") > 0.2
    elif option == "float_mask_4d":
        kw["attn_mask"] = torch.randn(b, 1, tq, tk, device="cuda", dtype=dtype)
    return x, q, k, v, kw, torch.randn(b, h, tq, d, device="cuda", dtype=dtype)


def sdpa_options(out_dir):
    """sdpa_kernels' recording with what it left out: dropout 0.1 (causal or not), a boolean [t, t] mask, a
    boolean and a float [b, h or 1, t, t] mask, grouped-query attention (8 query heads, 2 key/value heads): the
    backend torch._fused_sdp_choice picks and every op's own allocations (sdpa_options.json)."""
    sdpa_kernels(out_dir, options=SDPA_OPTIONS, shapes=((4, 8, 256, 256, 64), (2, 8, 197, 197, 64)),
                 name="sdpa_options.json")


def sdpa_kernels(out_dir, options=(None,), shapes=SDPA_SHAPES, name="sdpa_kernels.json"):
    """scaled_dot_product_attention forward and backward alone, for every shape of SDPA_SHAPES (batch, heads,
    query length, key length, head dim), dtype, causal or not, q/k/v packed in one projection (views, as a
    model's qkv split gives them) or separate: per op called, its name, arguments and own allocator events
    ("out" kept, "alloc"/"free" scratch), as op_programs labels them (sdpa_kernels.json)."""
    import torch.nn.functional as F
    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for (b, h, tq, tk, d), option in ((s, o) for s in shapes for o in options):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for causal in ((False, True) if tq == tk and "mask" not in (option or "") else (False,)):
                for packed in ((True, False) if tq == tk and option != "gqa" else (False,)):
                    names = []
                    x, q, k, v, kw, g = sdpa_case(torch, (b, h, tq, tk, d), dtype, option, causal, packed)
                    try:
                        choice = int(torch._fused_sdp_choice(q, k, v, kw.get("attn_mask"), kw.get("dropout_p", 0.0),
                                                             causal, enable_gqa=kw.get("enable_gqa", False)))
                    except RuntimeError:
                        choice = None
                    fresh()
                    torch.cuda.memory._record_memory_history(max_entries=100_000, context=None, stacks="python")
                    try:
                        with labelled_ops(names):
                            y = F.scaled_dot_product_attention(q, k, v, **kw)
                            y.backward(g)
                        err = None
                    except RuntimeError as e:
                        err = str(e).splitlines()[0][:200]
                    torch.cuda.synchronize()
                    snap = torch.cuda.memory._snapshot()
                    torch.cuda.memory._record_memory_history(enabled=None)
                    trace = [e for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
                    calls: dict = {}
                    for e in trace:
                        label = e.get("user_metadata") or ""
                        if label.startswith("op"):
                            calls.setdefault(int(label[2:]), []).append(e)
                    cases.append({"shape": [b, h, tq, tk, d], "dtype": str(dtype).replace("torch.", ""),
                                  "causal": causal, "packed": packed, "error": err, "option": option,
                                  "choice": choice,
                                  "ops": [[names[n], call_program(calls.get(n, []))] for n in range(len(names))]})
                    del x, q, k, v, g, kw
                    if not err:
                        del y
                    print(cases[-1]["shape"], cases[-1]["dtype"], option, choice, causal, packed, err,
                          [o[0].split(" ")[0] for o in cases[-1]["ops"] if "attention" in o[0]], flush=True)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"recorded_with": f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
                                    f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}",
                   "cases": cases}, f, separators=(",", ":"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--checkpoint-snapshots"]:
        train("mlp", 8, "fp32")                 # warm-up
        checkpoint_snapshots(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--more"]:
        train("mlp", 8, "fp32")                 # warm-up
        more(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--scratch"]:
        train("mlp", 8, "fp32")                 # warm-up
        scratch_programs(sys.argv[2] if len(sys.argv) > 2 else "out", tuple(sys.argv[3:]) or DTYPES)
    elif sys.argv[1:2] == ["--plain"]:
        train("mlp", 8, "fp32")                 # warm-up
        plain_sequences(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--segments"]:
        segments(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--held-out"]:
        held_out(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--held-out-driver"]:
        held_out(sys.argv[2] if len(sys.argv) > 2 else "out", repeats=0, batches=HELD_OUT_DRIVER, repeated=(),
                 name="held_out_driver.json")
    elif sys.argv[1:2] == ["--segments-one"]:
        print(json.dumps(segment_addresses(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])))
    elif sys.argv[1:2] == ["--not-monotone"]:
        not_monotone(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--sdpa-kernels"]:
        sdpa_kernels(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--sdpa-options"]:
        sdpa_options(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--sdpa"]:
        sdpa(sys.argv[2] if len(sys.argv) > 2 else "out", tuple(sys.argv[3:]))
    elif sys.argv[1:2] == ["--fresh-variants"]:
        fresh_variants(sys.argv[2] if len(sys.argv) > 2 else "out")
    elif sys.argv[1:2] == ["--variants"]:
        train("mlp", 8, "fp32")                 # warm-up
        variants(sys.argv[2] if len(sys.argv) > 2 else "out")
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "out")
