"""Overhead of `alloctrace record`: a program's wall time with and without the recorder preloaded.

    python bench/bench_record.py [--runs N] -- PROGRAM [ARGS...]

Runs alternate (plain, recorded, plain, ...) so a load change hits both; prints the medians, the
recording's size and how long importing it (replay through the model) takes. Example (llama.cpp, one
allocator call per token: set LLAMA_GRAPH_REUSE_DISABLE=1 for the worst case):

    LD_LIBRARY_PATH=bin python bench/bench_record.py -- bin/llama-completion -m model.gguf -n 512 --ignore-eos ...
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from alloctrace.traces.sources.record.build import recorder_library
from alloctrace.traces.sources.record.source import RecordingSource


def timed(argv, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("program", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.program[1:] if args.program[:1] == ["--"] else args.program
    lib = recorder_library()
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_PRELOAD=str(lib), ALLOCTRACE_RECORD_DIR=tmp)
        for _ in range(args.runs):
            plain.append(timed(argv, os.environ))
            for f in Path(tmp).glob("*"):
                f.unlink()
            recorded.append(timed(argv, env))
        files = list(Path(tmp).glob("rec-*.atrec"))
        size = sum(f.stat().st_size for f in files)
        t0 = time.perf_counter()
        graphs = consistent = 0
        for f in files:
            with open(f, "rb") as fh:
                for t in RecordingSource().read(fh, filename=f.name, name=None):
                    graphs += t.report["graphs"]
                    consistent += t.report["consistent"]
        t_import = time.perf_counter() - t0
    p, r = statistics.median(plain), statistics.median(recorded)
    print(f"plain     median {p:.3f} s  (min {min(plain):.3f})")
    print(f"recorded  median {r:.3f} s  (min {min(recorded):.3f})  overhead {r - p:+.3f} s ({(r / p - 1) * 100:+.0f}%)")
    print(f"recording {size / 1e6:.1f} MB, {graphs} graphs ({consistent} consistent), import {t_import:.2f} s")


if __name__ == "__main__":
    main()
