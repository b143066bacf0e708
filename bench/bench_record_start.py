"""The fixed cost of `alloctrace record` and of a sweep's point: wall time beyond the program itself.

    python bench/bench_record_start.py [--llama-bin DIR] [--model PATH] [--runs N] [--against PYTHON ...] [--json PATH]

Runs, alternating so that a change of load hits all of them: llama.cpp's weightless dry run
(`llama-fit-params -m MODEL -v`) plain; `alloctrace record --store FRESH -- ` the same; a shell loop of the 14
dry runs a sweep makes; `alloctrace sweep` of those 14 points. Prints record's time beyond the plain program (ms,
and the ratio of the two medians) and a sweep's time beyond the loop, per point. `--against PYTHON` also runs
the alloctrace installed into that interpreter (an older build, say) in the same rounds, for a before/after.
Run it with the Python alloctrace is installed into (`pip install .`): an editable install's import hook adds
its own start-up time to every run. Python keeps its compiled modules here, as an installed package has them.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from figures import Figure, add_option, at_most, write

CONTEXTS = (256, 512, 1024, 2048, 4096, 8192, 16384)
FA = ("on", "off")
GOAL_MS = 50


def timed(argv, env, shell=False) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", default=None, help="directory with llama-fit-params")
    ap.add_argument("--model", default=None)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--against", action="append", default=[], metavar="PYTHON",
                    help="also time the alloctrace of this interpreter (repeatable)")
    ap.add_argument("--no-sweep", action="store_true", help="record only")
    add_option(ap)
    a = ap.parse_args()
    bindir = Path(a.llama_bin or Path(os.environ.get("ALLOCTRACE_LLAMA_BIN", "")).parent)
    fit = bindir / "llama-fit-params"
    model = Path(a.model or bindir.parent / "models" / "tiny-llama.gguf")
    if not fit.exists() or not model.exists():
        sys.exit(f"needs {fit} and {model} (--llama-bin, --model or $ALLOCTRACE_LLAMA_BIN)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = dict(env, LD_LIBRARY_PATH=":".join(p for p in (str(bindir), os.environ.get("LD_LIBRARY_PATH")) if p))
    cmd = [str(fit), "-m", str(model), "-v"]
    loop = "set -e; " + " ; ".join(f"{shlex.join(cmd)} -c {c} -fa {fa} >/dev/null 2>&1" for c in CONTEXTS for fa in FA)
    pythons = [sys.executable, *a.against]
    names = ["this"] + [f"against {p}" for p in a.against]
    plain, loops = [], []
    rec = {p: [] for p in pythons}
    swp = {p: [] for p in pythons}
    with tempfile.TemporaryDirectory() as tmp:
        for p in pythons:  # compiled modules written, the recorder built, caches warm
            timed([p, "-m", "alloctrace", "record", "--store", f"{tmp}/warm", "--", *cmd], env)
        for k in range(a.runs):
            plain.append(timed(cmd, env))
            for i, p in enumerate(pythons):
                rec[p].append(timed([p, "-m", "alloctrace", "record", "--store", f"{tmp}/r{k}-{i}", "--", *cmd], env))
            plain.append(timed(cmd, env))
            if a.no_sweep:
                continue
            loops.append(timed(loop, env, shell=True))
            for i, p in enumerate(pythons):
                swp[p].append(timed([p, "-m", "alloctrace", "sweep", "--store", f"{tmp}/s{k}-{i}",
                                     "--vary=-c=" + ",".join(map(str, CONTEXTS)), "--vary=-fa=" + ",".join(FA),
                                     "--", *cmd], env))
    pm = statistics.median(plain)
    print(f"plain program        median {pm * 1000:6.1f} ms  (min {min(plain) * 1000:.1f}; {len(plain)} runs)")
    figures = []
    for name, p in zip(names, pythons):
        rm = statistics.median(rec[p])
        print(f"record ({name:>5})    median {rm * 1000:6.1f} ms  (min {min(rec[p]) * 1000:.1f})  beyond the program "
              f"{(rm - pm) * 1000:+.1f} ms, ratio {rm / pm:.2f}x")
        if p == sys.executable:
            figures += [at_most("record: wall time beyond the plain program (llama-fit-params, tiny model)",
                                (rm - pm) * 1000, "ms", GOAL_MS, f"the plain program: {pm * 1000:.1f} ms"),
                        Figure("record vs the plain program (wall)", round(rm / pm, 2), "x",
                               baseline=f"the plain program: {pm * 1000:.1f} ms")]
    if not a.no_sweep:
        n = len(CONTEXTS) * len(FA)
        lm = statistics.median(loops)
        print(f"loop of {n} plain runs median {lm * 1000:6.1f} ms")
        for name, p in zip(names, pythons):
            sm = statistics.median(swp[p])
            print(f"sweep ({name:>5})     median {sm * 1000:6.1f} ms  beyond the loop {(sm - lm) * 1000:+.1f} ms, "
                  f"{(sm - lm) * 1000 / n:+.1f} ms a point; ratio {sm / lm:.2f}x")
            if p == sys.executable:
                figures.append(Figure("sweep: wall time beyond the loop of plain runs, per point", round(
                    (sm - lm) * 1000 / n, 1), "ms", baseline=f"the loop of {n} plain runs: {lm * 1000:.0f} ms"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    write(a.json, figures)


if __name__ == "__main__":
    main()
