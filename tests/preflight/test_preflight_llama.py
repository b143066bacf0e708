"""Optional: pre-flight sweeps of the real llama.cpp (`ALLOCTRACE_LLAMA_BIN` names bin/llama-completion; its
llama-fit-params beside it; the model is ALLOCTRACE_LLAMA_MODEL or ../models/tiny-llama.gguf). Every point of a
weightless dry-run sweep must be the compute buffer the same command prints and the one a real llama-completion
run makes; the kq law must follow its shape; `fit` must find what an exhaustive scan finds."""
from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store

BIN = os.environ.get("ALLOCTRACE_LLAMA_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="ALLOCTRACE_LLAMA_BIN is not set (a llama-completion binary)")
PRINTED = re.compile(r"CPU compute buffer size =\s+([\d.]+) MiB")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    bindir = Path(BIN).resolve().parent
    model = Path(os.environ.get("ALLOCTRACE_LLAMA_MODEL") or bindir.parent / "models" / "tiny-llama.gguf")
    fit_params = bindir / "llama-fit-params"
    if not model.exists() or not fit_params.exists():
        pytest.skip(f"needs {model} and {fit_params}")
    with llama_programs(bindir, model) as programs:
        yield programs


@contextmanager
def llama_programs(bindir: Path, model: Path):
    """The llama.cpp build's programs and `model`, its libraries on LD_LIBRARY_PATH while in use."""
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = ":".join(p for p in (str(bindir), old) if p)
    try:
        yield {"fit": str(bindir / "llama-fit-params"), "completion": str(Path(BIN).resolve()), "model": str(model)}
    finally:
        if old is None:
            os.environ.pop("LD_LIBRARY_PATH")
        else:
            os.environ["LD_LIBRARY_PATH"] = old


# a dry run of these tiny models takes milliseconds. llama.cpp's log flush rarely deadlocks under load (every
# thread blocked in futex): such a run is killed after a minute and run once more (--retry-hung, default 1),
# so the rare hang costs the test a minute, not the test; a run that hangs twice fails it, saying where its
# threads were
PROGRAM_TIMEOUT_S = "60"


def run_json(capsys, *args) -> dict:
    """`alloctrace sweep|fit ... --json` run in this process, each program limited to PROGRAM_TIMEOUT_S."""
    rc = main([args[0], "--timeout", PROGRAM_TIMEOUT_S, *args[1:]])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    return json.loads(out.out)


def test_dry_run_sweep_is_what_llama_prints_and_what_a_real_run_makes(llama, tmp_path, capsys):
    import subprocess

    store = tmp_path / "store"
    out = run_json(capsys, "sweep", "--store", str(store), "--json", "--vary=-c=256,512,1024", "--vary=-fa=on,off",
                   "--", llama["fit"], "-m", llama["model"], "-v")
    assert len(out["points"]) == 6
    for p in out["points"]:
        assert p["consistent"] is True and p["error"] is None
        (size,) = p["buffers"].values()
        assert list(p["buffers"]) == ["CPU"]
        # the same command, run on its own: the size it prints
        cmd = [llama["fit"], "-m", llama["model"], "-v", "-c", p["values"]["-c"], "-fa", p["values"]["-fa"]]
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL, timeout=120)
        assert PRINTED.findall(r.stdout + r.stderr)[-1] == f"{size / 2**20:.2f}"
        assert p["printed"]["compute"]["CPU"] == round(size / 2**20, 2)
        assert p["printed"]["kv_cache"] == {"CPU": int(p["values"]["-c"]) / 512}  # tiny-llama: 1 MiB per 512 cells
        assert p["check"]["agrees"]  # the total against the breakdown the same run printed
    sizes = {(p["values"]["-c"], p["values"]["-fa"]): p["buffers"]["CPU"] for p in out["points"]}
    assert sizes[("512", "on")] == 6_961_152 and sizes[("512", "off")] == 12_593_152  # the allocator's own log
    for fa in ("on", "off"):  # a separate, real llama-completion run of two points
        real = tmp_path / f"real-{fa}"
        rc = main(["record", "--store", str(real), "--", llama["completion"], "-m", llama["model"], "-p", "Hello",
                   "-n", "2", "-c", "512", "-b", "512", "-ub", "512", "-fa", fa, "-t", "2", "-ngl", "0", "--temp", "0",
                   "-no-cnv", "-fit", "off"])
        assert rc == 0
        s = open_store(real)
        (t,) = s.list()
        graphs = s.summary(t["id"])["graphs"]
        assert all(g["consistent"] for g in graphs)
        assert max(g["buffer_size"] for g in graphs) == sizes[("512", fa)]


def test_kq_law_follows_its_shape(llama, tmp_path, capsys):
    out = run_json(capsys, "sweep", "--store", str(tmp_path), "--json", "--vary=-c=512,1024", "--vary=-ub=128,256",
                   "--", llama["fit"], "-m", llama["model"], "-fa", "off")
    kq = next(x for x in out["laws"] if x["family"] == "kq")["law"]
    n_head = 8  # tiny-llama
    assert kq["kind"] == "shape" and kq["type"] == "f32" and kq["bytes_per_element"] == 4
    assert kq["dims"] == ["-c", "-ub", n_head, 1]  # kq per layer = n_ctx·n_ubatch·n_head·4
    for p in out["points"]:
        f = next(f for f in p["families"] if f["family"] == "kq")
        assert f["tensor_bytes"] == 4 * int(p["values"]["-c"]) * int(p["values"]["-ub"]) * n_head
    assert all(d["runs"][0]["family"] == "kq" for d in out["dominance"])
    from alloctrace.traces.preflight.laws import law_lines

    assert "  kq: 4·-c·-ub·8 B per layer (kq-0: f32 [-c, -ub, 8, 1])  [fitted on -c=512..1024, -ub=128..256]" \
        in law_lines(out["laws"])


def test_fit_finds_the_largest_context_of_an_exhaustive_scan(llama, tmp_path, capsys):
    budget = 30 * 2**20
    cmd = ["--", llama["fit"], "-m", llama["model"], "-fa", "off", "-v"]
    scan = run_json(capsys, "sweep", "--store", str(tmp_path / "scan"), "--json",
                    "--vary=-c=" + ",".join(str(256 * k) for k in range(1, 9)), *cmd)
    totals = {}
    for p in scan["points"]:
        pr = p["printed"]
        totals[int(p["values"]["-c"])] = sum(p["buffers"].values()) + round(
            (sum(pr["weights"].values()) + sum(pr["kv_cache"].values())) * 2**20)
    best = max(c for c, t in totals.items() if t <= budget)
    out = run_json(capsys, "fit", "--store", str(tmp_path / "fit"), "--json", "--budget", "30MiB",
                   "--vary=-c=256..2048", *cmd)
    assert out["value"] == best and out["total"] == totals[best]  # llama.cpp pads n_ctx to 256: same answer
    assert out["next"]["value"] == best + 1 and out["next"]["total"] > budget
