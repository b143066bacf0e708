"""Run one PyTorch program plainly and under the record hook on a GPU machine, and write what each saw:
allocator settings chosen after `import torch`, visible devices, fork DataLoader workers, memory_stats.
Usage: python bench/torch_hook_gpu.py HOOK_DIR OUT.json (HOOK_DIR: traces/sources/torch/hook).
tests/torch/test_torch_hook_plain.py checks the committed result, tests/data/torch_hook_gpu.json."""
import json
import os
import subprocess
import sys
import tempfile

PROGRAM = r"""
import json, os, sys
import torch
from torch.utils.data import DataLoader
mode = sys.argv[1]
seen = {"cuda_initialized_after_import": torch.cuda.is_initialized()}
if mode == "hidden":  # the program hides the GPUs after import torch
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    seen["device_count"] = torch.cuda.device_count()
    seen["is_available"] = torch.cuda.is_available()
    print(json.dumps(seen)); sys.exit(0)
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # chosen after import torch
loader = DataLoader(torch.arange(64.0), batch_size=8, num_workers=2, multiprocessing_context="fork")
seen["batches"] = sum(1 for _ in loader)
seen["device_count"] = torch.cuda.device_count()
xs = [torch.empty(n << 20, dtype=torch.uint8, device="cuda") for n in (1, 3, 30, 300)]
del xs[1]
y = torch.ones(1 << 20, device="cuda") * 2
torch.cuda.synchronize()
seen["memory_stats"] = torch.cuda.memory_stats()
seen["expandable"] = sorted({s["is_expandable"] for s in torch.cuda.memory._snapshot()["segments"]})
del xs, y
print(json.dumps(seen))
"""


def run(mode, hook_dir, out_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALLOCTRACE_", "PYTORCH_CUDA_ALLOC"))}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if hook_dir:
        env.update(PYTHONPATH=os.pathsep.join(p for p in (hook_dir, env.get("PYTHONPATH", "")) if p),
                   ALLOCTRACE_TORCH_DIR=out_dir, ALLOCTRACE_TORCH_STACKS="python",
                   ALLOCTRACE_TORCH_MAX_ENTRIES="100000")
    p = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True, timeout=200)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    seen["snapshots"] = sorted(f for f in os.listdir(out_dir) if f.endswith(".pickle")) if hook_dir else []
    return seen


def main():
    hook_dir, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    import torch
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    for mode in ("used", "hidden"):
        with tempfile.TemporaryDirectory() as d:
            result[mode] = {"plain": run(mode, None, d), "recorded": run(mode, hook_dir, d)}
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
