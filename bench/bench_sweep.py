"""A pre-flight sweep against the same runs without alloctrace: `alloctrace sweep --vary` of llama.cpp's
weightless dry run (14 points: 7 contexts x flash attention on/off) against the same 14 commands run one after
another in a shell loop. Goal: the sweep (recorder, replays, store, laws; Python's start included) takes at
most 1.5x the loop's wall time.

    python bench/bench_sweep.py [--llama-bin DIR] [--model PATH | --sparse 1b|7b] [--runs N] [-j N] [--json PATH]

DIR holds llama-fit-params and its libraries (default: the directory of $ALLOCTRACE_LLAMA_BIN); the model
defaults to DIR/../models/tiny-llama.gguf. `--sparse 7b` writes a GGUF of Llama-2-7B's shape whose weights are
a hole in the file (bench/sparse_gguf.py) and sweeps that: a dry run of a real model's graphs (~0.13 s each
here) instead of the tiny model's 22 ms. Runs alternate (loop, sweep, loop, ...) and the medians are compared.
Run it with the Python alloctrace is installed into (`pip install .`); an editable install's import hook
adds its own start-up time to every run.
"""
from __future__ import annotations

import argparse
import os
import resource
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


def timed(argv, env, shell=False) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and everything it started)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, env=env, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", default=None, help="directory with llama-fit-params")
    ap.add_argument("--model", default=None)
    ap.add_argument("--sparse", choices=("1b", "7b"), default=None,
                    help="sweep a GGUF of this real model's shape with no weights on disk (bench/sparse_gguf.py)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-j", "--jobs", type=int, default=None, help="the sweep's -j (default: its own, the cores)")
    add_option(ap)
    a = ap.parse_args()
    bindir = Path(a.llama_bin or Path(os.environ.get("ALLOCTRACE_LLAMA_BIN", "")).parent)
    fit = bindir / "llama-fit-params"
    scratch = tempfile.TemporaryDirectory()
    if a.sparse:
        from sparse_gguf import write as write_sparse

        model = Path(scratch.name) / f"sparse-{a.sparse}.gguf"
        write_sparse(str(model), a.sparse)
    else:
        model = Path(a.model or bindir.parent / "models" / "tiny-llama.gguf")
    if not fit.exists() or not model.exists():
        sys.exit(f"needs {fit} and {model} (--llama-bin, --model or $ALLOCTRACE_LLAMA_BIN)")
    # as installed: Python keeps its compiled modules (a PYTHONDONTWRITEBYTECODE environment recompiles every run)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = dict(env, LD_LIBRARY_PATH=":".join(p for p in (str(bindir), os.environ.get("LD_LIBRARY_PATH")) if p))
    cmd = [str(fit), "-m", str(model), "-v"]
    loop = " ; ".join(f"{shlex.join(cmd)} -c {c} -fa {fa} >/dev/null 2>&1" for c in CONTEXTS for fa in FA)
    loop = f"set -e; {loop}"
    sweep = [sys.executable, "-m", "alloctrace", "sweep", "--vary=-c=" + ",".join(map(str, CONTEXTS)),
             "--vary=-fa=" + ",".join(FA), *(["-j", str(a.jobs)] if a.jobs else []), "--", *cmd]
    plain, swept = [], []
    with tempfile.TemporaryDirectory() as tmp:
        timed(sweep + [], dict(env, ALLOCTRACE_STORE=str(Path(tmp) / "warm")))  # the recorder is built, caches warm
        for k in range(a.runs):
            plain.append(timed(loop, env, shell=True))
            swept.append(timed(sweep, dict(env, ALLOCTRACE_STORE=str(Path(tmp) / f"s{k}"))))
    p, s = statistics.median(w for w, _ in plain), statistics.median(w for w, _ in swept)
    pc, sc = statistics.median(c for _, c in plain), statistics.median(c for _, c in swept)
    n = len(CONTEXTS) * len(FA)
    runs = lambda xs: ", ".join(f"{w:.3f}" for w, _ in xs)  # noqa: E731
    print(f"{n} plain runs in a shell loop  median {p:.3f} s wall, {pc:.3f} s CPU  (runs: {runs(plain)})")
    print(f"alloctrace sweep, {n} points   median {s:.3f} s wall, {sc:.3f} s CPU  (runs: {runs(swept)})")
    print(f"ratio {s / p:.2f}x wall (goal <= 1.5x), {sc / pc:.2f}x CPU; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    what = f"sparse {a.sparse} model" if a.sparse else model.name
    print(f"model: {what}; one plain dry run {p / n * 1000:.0f} ms")
    scratch.cleanup()
    write(a.json, [at_most(f"sweep of 14 llama-fit-params points ({what}) vs a shell loop (wall)", s / p, "x", 1.5,
                           f"14 plain runs in a shell loop: {p:.3f} s"),
                   Figure("the same, CPU time", round(sc / pc, 2), "x", baseline=f"the loop's CPU: {pc:.3f} s"),
                   Figure("sweep of 14 points", round(s, 3), "s")])


if __name__ == "__main__":
    main()
