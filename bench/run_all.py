"""Run every benchmark in bench/ and print one table: each figure, its goal, the side-by-side
baseline it is a ratio to, and the command that produced it.

Benchmarks are the bench_*.py files next to this one. One that takes `--json PATH`
(bench/figures.py) contributes its figures; one that does not is listed with its command
and the last line it printed. Their own output goes to stderr as they run; the table
(Markdown) goes to stdout.

    python bench/run_all.py [--quick] [--skip NAME ...] [--only NAME ...] [--real-log PATH] [--list]

`--real-log` (or $ALLOCTRACE_REAL_LOG) is a real long ggml log (e.g. a gpt-2 run generating 300
tokens, .xz is fine) for the "import a real long log" figure; without it that run is skipped.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from figures import Figure, read

HERE = Path(__file__).resolve().parent
SLOW = {"bench_server", "bench_web", "bench_diff", "bench_replay"}  # minutes each; `--skip-slow` leaves them out


def runs_of(name: str, quick: bool, real_log: str | None) -> list[list[str]]:
    """The argument lists a benchmark is run with (one run each)."""
    if name == "bench_import":
        mb = ["--mb", "20"] if quick else []
        runs = [mb, ["--vary", "--no-large-graph", "--mb", "10" if quick else "30"]]
        if real_log:
            runs.append(["--log", real_log, "--no-large-graph"])
        return runs
    if quick:
        return [{"bench_server": ["--requests", "500", "--seconds", "30", "--upload-mb", "0"],
                 "bench_diff": ["300000"], "bench_web": ["--runs", "1"], "bench_model": ["80", "512", "2"],
                 "bench_hazards": ["--repeat", "1"], "bench_record_start": ["--runs", "3"]}.get(name, [])]
    return [[]]


def takes_json(path: Path) -> bool:
    """The benchmark takes `--json PATH` (its own option, or bench/figures.py's)."""
    text = path.read_text(errors="replace")
    return "--json" in text or "from figures import" in text


def run_one(path: Path, args: list[str], timeout: float) -> tuple[list[Figure], str, str]:
    """(figures, command, note) of one benchmark run."""
    rel = os.path.relpath(path, Path.cwd())
    command = shlex.join(["python", rel, *args])
    print(f"\n=== {command}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "figures.json"
        argv = [sys.executable, str(path), *args] + (["--json", str(out)] if takes_json(path) else [])
        t0 = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        last = ""
        for line in p.stdout:  # the benchmark's own output, as it comes
            sys.stderr.write(line)
            last = line.strip()[:120] or last
        p.wait()
        timer.cancel()
        if time.perf_counter() - t0 >= timeout:
            return [], command, f"timed out after {timeout:.0f} s"
        took = f"{time.perf_counter() - t0:.0f} s"
        if p.returncode:
            return [], command, f"failed (exit {p.returncode}): {last}"
        if not out.exists():
            return [], command, f"no machine-readable figures (no --json); last line: {last}"
        return read(out), command, took


def table(rows: list[tuple[Figure | None, str, str]]) -> str:
    lines = ["| figure | value | goal | met | baseline (side by side) | command |", "|---|---|---|---|---|---|"]
    for fig, command, note in rows:
        if fig is None:
            lines.append(f"| {note} | | | | | `{command}` |")
            continue
        met = "" if fig.ok is None else ("yes" if fig.ok else "**no**")
        lines.append(f"| {fig.figure} | {fig.text()} | {fig.goal} | {met} | {fig.baseline} | `{command}` |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats where a benchmark has them")
    ap.add_argument("--skip", nargs="+", default=[], metavar="NAME", help="benchmarks to leave out (bench_x or x)")
    ap.add_argument("--skip-slow", action="store_true", help=f"leave out {', '.join(sorted(SLOW))}")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME", help="run only these benchmarks")
    ap.add_argument("--real-log", default=os.environ.get("ALLOCTRACE_REAL_LOG"),
                    help="a real long ggml log for the real-log import figure")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one benchmark run may take")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and their runs, run nothing")
    a = ap.parse_args(argv)

    def norm(n):
        n = Path(n).stem
        return n if n.startswith("bench_") else "bench_" + n

    skip, only = {norm(n) for n in a.skip}, {norm(n) for n in a.only}
    if a.skip_slow:
        skip |= SLOW
    benches = [p for p in sorted(HERE.glob("bench_*.py"))
               if p.stem not in skip and (not only or p.stem in only)]
    rows: list[tuple[Figure | None, str, str]] = []
    for path in benches:
        for args in runs_of(path.stem, a.quick, a.real_log):
            if a.list:
                print(shlex.join(["python", os.path.relpath(path, Path.cwd()), *args])
                      + ("" if takes_json(path) else "   (no --json)"))
                continue
            figures, command, note = run_one(path, args, a.timeout)
            rows += [(f, command, note) for f in figures] or [(None, command, note)]
    if not a.list:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
