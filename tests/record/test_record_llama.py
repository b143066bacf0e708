"""Optional: record a real llama.cpp binary (`ALLOCTRACE_LLAMA_BIN`, e.g. .../bin/llama-completion of a CPU build
with shared libraries) on a GGUF model (`ALLOCTRACE_LLAMA_MODEL`, default ../models/tiny-llama.gguf next to the
binary's directory). The trace's compute buffer must be the one llama.cpp prints, and every graph consistent."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.traces.store.store import open_store

BIN = os.environ.get("ALLOCTRACE_LLAMA_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="ALLOCTRACE_LLAMA_BIN is not set (a llama-completion binary)")

PRINTED = re.compile(r"sched_reserve:\s+CPU compute buffer size =\s+([\d.]+) MiB")
PRINTED_4 = re.compile(r"CPU compute buffer size is\s+([\d.]+) MiB")
# bytes the allocator's own AT_PRINTF log gives for tiny-llama at n_ctx 512, n_ubatch 512
TINY_LLAMA_512 = {"on": 6_961_152, "off": 12_593_152}


def model_path() -> Path:
    m = os.environ.get("ALLOCTRACE_LLAMA_MODEL")
    return Path(m) if m else Path(BIN).resolve().parent.parent / "models" / "tiny-llama.gguf"


@pytest.mark.parametrize("n_ctx,n_ubatch,fa,fit", [
    (512, 512, "on", "off"), (512, 512, "off", "off"), (1024, 256, "on", "off"), (256, 128, "off", "off"),
    (512, 512, "off", "on"),
])
def test_llama_compute_buffer_matches_the_printed_size(tmp_path, n_ctx, n_ubatch, fa, fit):
    model = model_path()
    if not model.exists():
        pytest.skip(f"no model at {model} (set ALLOCTRACE_LLAMA_MODEL)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(Path(BIN).resolve().parent), env.get("LD_LIBRARY_PATH")) if p)
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "alloctrace", "record", "--store", str(store), "--name", "llama", "--",
           BIN, "-m", str(model), "-p", "The quick brown fox jumps over the lazy dog.", "-n", "4",
           "-c", str(n_ctx), "-b", str(max(n_ubatch, 512)), "-ub", str(n_ubatch), "-fa", fa, "-t", "2", "-tb", "2",
           "-ngl", "0", "--temp", "0", "--seed", "42", "-no-cnv", "-fit", fit, "-v"]
    r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = PRINTED.findall(r.stdout + r.stderr)
    assert printed, "llama.cpp printed no compute buffer size"
    s = open_store(store)
    (t,) = s.list()
    graphs = s.summary(t["id"])["graphs"]
    assert graphs and all(g["consistent"] for g in graphs)
    reserves = [s.graph(t["id"], g["index"]) for g in graphs]
    context = [g for g in reserves if g.extra.get("via") == "sched_reserve"]
    size = max(g.buffer_size for g in context)
    assert f"{size / 2**20:.2f}" == printed[-1]
    for p4 in PRINTED_4.findall(r.stdout + r.stderr):
        assert f"{size / 2**20:.4f}" == p4
    if model.name == "tiny-llama.gguf" and (n_ctx, n_ubatch) == (512, 512):
        assert size == TINY_LLAMA_512[fa]
    if fit == "on":  # the weightless dry run plans the same worst case, sizes only
        dry = [g for g in reserves if g.extra["call"] == "reserve_n_size"]
        assert dry and dry[0].buffer_size == size
    print(json.dumps({"n_ctx": n_ctx, "n_ubatch": n_ubatch, "fa": fa, "fit": fit, "printed_mib": printed[-1],
                      "recorded": size, "graphs": len(graphs)}))
