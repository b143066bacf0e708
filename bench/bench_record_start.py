"""The fixed cost of `alloctrace record` and of a sweep's point: wall time beyond the program itself.

    python bench/bench_record_start.py [--llama-bin DIR] [--model PATH] [--runs N] [--against PYTHON ...] [--json PATH]

Runs, alternating so that a change of load hits all of them: llama.cpp's weightless dry run
(`llama-fit-params -m MODEL -v`) plain; `python -c pass`; `alloctrace record --store STORE -- ` the same (into a
store an earlier record made, and into a new one); a shell loop of the 14 dry runs a sweep makes; `alloctrace
sweep` of those 14 points; the same for 4 points. Prints record's time beyond the plain program (ms, and the
ratio of the medians; CPU time too), a sweep's time beyond its loop, and what each point past the 4th costs
beyond its program ((14-point sweep - its loop) - (4-point sweep - its loop), over 10). `--against PYTHON`
also runs the alloctrace installed into that interpreter (an older build, say) in the same rounds.
Run it with the Python alloctrace is installed into (`pip install .`): an editable install's import hook adds
its own start-up time to every run. Python keeps its compiled modules here, as an installed package has them.
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
GOAL_MS = 50


CPU: dict[int, list[float]] = {}  # id of a list of wall times -> the CPU seconds of the same runs


def timed(argv, env, shell=False, into: list | None = None) -> float:
    """Wall seconds of one run; with `into`, appended there, and its CPU seconds (the command and everything it
    started) kept beside them (CPU time holds up better than wall time on a loaded machine)."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(argv, env=env, shell=shell, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if into is not None:
        into.append(wall)
        CPU.setdefault(id(into), []).append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return wall


def cpu(runs: list) -> float:
    return statistics.median(CPU[id(runs)])


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
    def shell_loop(contexts, fas):
        runs = [f"{shlex.join(cmd)} -c {c} -fa {fa} >/dev/null 2>&1" for c in contexts for fa in fas]
        return "set -e; " + " ; ".join(runs)

    def sweep(p, store, contexts, fas):
        return [p, "-m", "alloctrace", "sweep", "--store", store, "--vary=-c=" + ",".join(map(str, contexts)),
                "--vary=-fa=" + ",".join(fas), "--", *cmd]

    small = (CONTEXTS[:4], FA[:1])  # 4 points: the sweep's fixed cost, for the cost of one more point
    loop, small_loop = shell_loop(CONTEXTS, FA), shell_loop(*small)
    pythons = [sys.executable, *a.against]
    names = ["this"] + [f"against {p}" for p in a.against]
    plain, loops, bare = [], [], []
    rec = {p: [] for p in pythons}  # into a store made by an earlier record (the usual case)
    new = {p: [] for p in pythons}  # into a new store (its schema made too)
    swp = {p: [] for p in pythons}
    few = {p: [] for p in pythons}
    small_loops = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, p in enumerate(pythons):  # compiled modules written, the recorder built, caches warm
            timed([p, "-m", "alloctrace", "record", "--store", f"{tmp}/warm{i}", "--", *cmd], env)
        for k in range(a.runs):
            timed(cmd, env, into=plain)
            timed([sys.executable, "-c", "pass"], env, into=bare)  # the interpreter's own start (site included)
            for i, p in enumerate(pythons):
                timed([p, "-m", "alloctrace", "record", "--store", f"{tmp}/warm{i}", "--", *cmd], env, into=rec[p])
            timed(cmd, env, into=plain)
            for i, p in enumerate(pythons):
                timed([p, "-m", "alloctrace", "record", "--store", f"{tmp}/r{k}-{i}", "--", *cmd], env, into=new[p])
            if a.no_sweep:
                continue
            loops.append(timed(loop, env, shell=True))
            for i, p in enumerate(pythons):
                swp[p].append(timed(sweep(p, f"{tmp}/s{k}-{i}", CONTEXTS, FA), env))
            small_loops.append(timed(small_loop, env, shell=True))
            for i, p in enumerate(pythons):
                few[p].append(timed(sweep(p, f"{tmp}/f{k}-{i}", *small), env))
    pm = statistics.median(plain)
    bm = statistics.median(bare)
    print(f"plain program        median {pm * 1000:6.1f} ms  (min {min(plain) * 1000:.1f}; {len(plain)} runs), "
          f"CPU {cpu(plain) * 1000:.1f} ms")
    print(f"python -c pass       median {bm * 1000:6.1f} ms  (min {min(bare) * 1000:.1f}), "
          f"CPU {cpu(bare) * 1000:.1f} ms: the part of any Python command's time no change to alloctrace removes")
    figures = []
    for name, p in zip(names, pythons):
        rm, nm = statistics.median(rec[p]), statistics.median(new[p])
        print(f"record ({name})  median {rm * 1000:6.1f} ms  (min {min(rec[p]) * 1000:.1f})  beyond the program "
              f"{(rm - pm) * 1000:+.1f} ms, ratio {rm / pm:.2f}x;  into a new store: median {nm * 1000:.1f} ms, "
              f"beyond {(nm - pm) * 1000:+.1f} ms, {nm / pm:.2f}x")
        print(f"    CPU: {cpu(rec[p]) * 1000:.1f} ms, "
              f"beyond the program's {(cpu(rec[p]) - cpu(plain)) * 1000:+.1f} ms; "
              f"into a new store {cpu(new[p]) * 1000:.1f} ms")
        if p == sys.executable:
            figures += [at_most("record: wall time beyond the plain program (llama-fit-params, tiny model)",
                                (rm - pm) * 1000, "ms", GOAL_MS, f"the plain program: {pm * 1000:.1f} ms"),
                        Figure("record vs the plain program (wall)", round(rm / pm, 2), "x",
                               baseline=f"the plain program: {pm * 1000:.1f} ms"),
                        Figure("record into a new store: wall time beyond the plain program", round(
                            (nm - pm) * 1000, 1), "ms", baseline=f"the plain program: {pm * 1000:.1f} ms"),
                        Figure("Python's own start (python -c pass)", round(bm * 1000, 1), "ms")]
    if not a.no_sweep:
        n, n_few = len(CONTEXTS) * len(FA), len(small[0]) * len(small[1])
        lm, lf = statistics.median(loops), statistics.median(small_loops)
        print(f"loop of {n} plain runs median {lm * 1000:6.1f} ms; of {n_few}: {lf * 1000:.1f} ms")
        for name, p in zip(names, pythons):
            sm, fm = statistics.median(swp[p]), statistics.median(few[p])
            beyond, beyond_few = sm - lm, fm - lf
            per_point = (beyond - beyond_few) / (n - n_few)
            print(f"sweep ({name})  {n} points: median {sm * 1000:6.1f} ms, beyond the loop {beyond * 1000:+.1f} ms "
                  f"({sm / lm:.2f}x); {n_few} points: {fm * 1000:.1f} ms, beyond {beyond_few * 1000:+.1f} ms; "
                  f"each point past the {n_few}th {per_point * 1000:+.1f} ms")
            if p == sys.executable:
                figures += [Figure(f"sweep of {n} points: wall time beyond the loop of plain runs", round(
                                beyond * 1000, 1), "ms", baseline=f"the loop of {n} plain runs: {lm * 1000:.0f} ms"),
                            Figure("sweep: wall time beyond the plain run, for each point past the first "
                                   f"{n_few}", round(per_point * 1000, 1), "ms",
                                   baseline=f"loops of {n} and {n_few} plain runs: "
                                            f"{lm * 1000:.0f}, {lf * 1000:.0f} ms")]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    write(a.json, figures)


if __name__ == "__main__":
    main()
