"""The PyTorch record hook must not change the program it records: with the real torch (CPU build here),
a program sees the same environment, no CUDA initialised by the hook, and fork DataLoader workers that work,
exactly as without the hook. The GPU half (allocator settings, visible devices, memory_stats) is checked
against tests/data/torch_hook_gpu.json, measured on a GPU machine by bench/torch_hook_gpu.py."""
import json
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest

from alloctrace.traces.sources.torch.recorder import hook_env

GPU_RESULT = Path(__file__).parents[1] / "data" / "torch_hook_gpu.json"

PROGRAM = textwrap.dedent("""\
    import json, os, subprocess, sys
    import torch
    from torch.utils.data import DataLoader
    seen = {"cuda_initialized_after_import": torch.cuda.is_initialized(), "env": dict(os.environ)}
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"  # set after import, as programs do
    loader = DataLoader(list(range(64)), batch_size=8, num_workers=2, multiprocessing_context="fork")
    seen["batches"] = [b.tolist() for b in loader]
    seen["cuda_initialized_at_end"] = torch.cuda.is_initialized()
    child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                           capture_output=True, text=True, check=True)
    seen["child_env"] = json.loads(child.stdout)
    print(json.dumps(seen))
""")


def run(tmp_path, env):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    p = subprocess.run([sys.executable, str(prog)], env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def without_noise(env):
    return {k: v for k, v in env.items() if k not in ("_",)}


def test_the_program_sees_what_it_sees_without_the_hook(tmp_path):
    pytest.importorskip("torch")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCTRACE_")}
    plain = run(tmp_path, base)
    hooked_env = {**base, **hook_env(tmp_path / "snaps", environ=base)}
    assert hooked_env["PYTHONPATH"] != base.get("PYTHONPATH")  # the hook is really on the path
    hooked = run(tmp_path, hooked_env)
    assert hooked["cuda_initialized_after_import"] is False
    assert hooked["cuda_initialized_at_end"] == plain["cuda_initialized_at_end"]
    assert hooked["batches"] == plain["batches"] == [list(range(i, i + 8)) for i in range(0, 64, 8)]
    assert without_noise(hooked["env"]) == without_noise(plain["env"])
    assert without_noise(hooked["child_env"]) == without_noise(plain["child_env"])
    assert not any(k.startswith("ALLOCTRACE_TORCH") for k in hooked["child_env"])


def test_on_the_gpu_machine_recorded_and_plain_runs_saw_the_same():
    """Measured on an H200 (bench/torch_hook_gpu.py): settings and devices chosen after import applied,
    fork workers worked, memory_stats equal; and the recorded run did leave its snapshot."""
    result = json.loads(GPU_RESULT.read_text())
    used, hidden = result["used"], result["hidden"]
    for runs in (used, hidden):
        assert "error" not in runs["plain"] and "error" not in runs["recorded"], runs
    plain, recorded = used["plain"], used["recorded"]
    assert recorded["cuda_initialized_after_import"] is False
    assert recorded["batches"] == plain["batches"] == 8  # DataLoader with two fork workers
    assert recorded["expandable"] == plain["expandable"] == [True]  # PYTORCH_CUDA_ALLOC_CONF set after import
    assert recorded["device_count"] == plain["device_count"] >= 1
    assert recorded["memory_stats"] == plain["memory_stats"]
    assert recorded["memory_stats"]["allocated_bytes.all.peak"] > 300 << 20
    assert plain["snapshots"] == [] and len(recorded["snapshots"]) == 1
    # CUDA_VISIBLE_DEVICES="" set after import hides the GPU from the recorded program too
    assert hidden["recorded"]["device_count"] == hidden["plain"]["device_count"] == 0
    assert hidden["recorded"]["is_available"] is hidden["plain"]["is_available"] is False
