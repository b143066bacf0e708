"""What `alloctrace sweep --vary` does before its first program starts: the parent imports, before forking
its workers, what they start programs and read recordings with (once, shared by every worker), but not
what only it needs later (the store, the growth laws) nor what nobody needs (hashlib, pkgutil), and finds
the recorder without hashlib. Each check runs in a fresh interpreter (this one has imported everything)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from alloctrace.traces.util import cbuild
from sweep_program import expected_bytes

PROGRAM = [sys.executable, str(Path(__file__).parents[1].joinpath("sweep_program.py"))]
# the parent's alone, once points come back (the store, the laws), or nobody's on this path (hashlib: OpenSSL)
NOT_BEFORE_FORK = {"hashlib", "_hashlib", "sqlite3", "pkgutil", "alloctrace.traces.store.store",
                   "alloctrace.traces.store.sqlite", "alloctrace.traces.preflight.sweeps",
                   "alloctrace.traces.preflight.laws", "alloctrace.allocator.legacy"}
# what a worker starts its program with and reads the recording with: imported once, before the fork
SHARED = {"subprocess", "alloctrace.traces.sources.record.run", "alloctrace.traces.util.cbuild",
          "alloctrace.traces.sources.record.source", "alloctrace.traces.sources.record.plans",
          "alloctrace.traces.explain.peak_fast"}

AT_FORK = """
import os, sys
import subprocess
real_fork, real_popen, seen, started = os.fork, subprocess.Popen, [], []
def fork():
    if not seen:
        seen.append(sorted(sys.modules))
    return real_fork()
class Popen(real_popen):
    def __init__(self, *args, **kwargs):
        if not seen:
            started.append(args[0][0])
        super().__init__(*args, **kwargs)
real_spawn = os.posix_spawn
def posix_spawn(path, argv, *args, **kwargs):
    if not seen:
        started.append(argv[0])
    return real_spawn(path, argv, *args, **kwargs)
os.fork, subprocess.Popen, os.posix_spawn = fork, Popen, posix_spawn
from alloctrace.cli import main
rc = main(sys.argv[1:])
import json
print(json.dumps({"rc": rc, "modules": seen[0] if seen else None, "started": started}), file=sys.stderr)
"""


def fresh(code: str, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_the_parent_forks_before_importing_what_only_points_need(tmp_path):
    """Without the compiled replay a point's read is Python's, and forked workers read on every core."""
    run = fresh(AT_FORK, "sweep", "--store", str(tmp_path / "s"), "--vary=-c=128,256", "-j", "2", "--json", "--",
                *PROGRAM, "-nh", "4", env={"ALLOCTRACE_PURE_PYTHON": "1"})
    at_fork = json.loads(run.stderr.strip().splitlines()[-1])
    assert at_fork["rc"] == 0, run.stderr
    assert [p["buffers"] for p in json.loads(run.stdout)["points"]] == [
        {"CPU": expected_bytes(c, 64, 4)} for c in (128, 256)]  # the sweep still works: exact bytes
    modules = set(at_fork["modules"])
    assert not modules & NOT_BEFORE_FORK, sorted(modules & NOT_BEFORE_FORK)
    assert SHARED <= modules, sorted(SHARED - modules)
    # the first two programs ran while those were imported (the workers read them)
    assert at_fork["started"] == [sys.executable] * 2


def test_a_first_program_that_cannot_start_is_its_points_error(tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    run = fresh(AT_FORK, "sweep", "--store", str(tmp_path / "s"), "--vary=-c=1,2,3", "-j", "2", "--json", "--",
                str(script))
    assert json.loads(run.stderr.strip().splitlines()[-1])["rc"] == 1, run.stderr
    points = json.loads(run.stdout)["points"]
    assert [p["exit_status"] for p in points] == [127] * 3
    assert all(p["error"] == f"cannot run {script}: Permission denied" for p in points), points


def test_library_names_hash_with_sha256_without_hashlib(tmp_path):
    data = bytes(range(256)) * 41
    assert cbuild.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    src = tmp_path / "x.c"
    src.write_bytes(data)
    digest = hashlib.sha256(data + b"extra" + b"-O2 -shared").hexdigest()[:16]
    assert cbuild.library_name(src, "x", ["-O2", "-shared"], b"extra") == f"x-{digest}.so"
    run = fresh("import sys; from alloctrace.traces.sources.record.build import recorder_library\n"
                "print(recorder_library()); print('hashlib' in sys.modules)")
    lib, hashlib_imported = run.stdout.split()
    assert run.returncode == 0 and Path(lib).is_file() and hashlib_imported == "False", run.stderr


def test_the_allocator_package_imports_a_model_when_it_is_asked_for():
    run = fresh("import sys\nimport alloctrace.allocator.profiles\nprint('alloctrace.allocator.gallocr' in sys.modules)\n"
                "import alloctrace.allocator.render\nfrom alloctrace.allocator import render, Gallocr, PROFILES\n"
                "from alloctrace.allocator.gallocr import Gallocr as G\n"
                "print(callable(render) and render.__module__, Gallocr is G, 'ggml-head' in PROFILES)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "alloctrace.allocator.render", "True", "True"]
    run = fresh("import alloctrace.allocator as a\nprint(sorted(n for n in a.__all__ if getattr(a, n) is None))\n"
                "a.NoSuchName")
    assert run.stdout.strip() == "[]" and "AttributeError" in run.stderr and "NoSuchName" in run.stderr


def test_the_sources_package_imports_its_readers_when_a_file_is_read():
    run = fresh("import sys\nimport alloctrace.traces.sources.record.run\n"
                "print(sorted(m for m in ('zstandard', 'alloctrace.traces.sources.base', 'inspect') if m in sys.modules))\n"
                "from alloctrace.traces.sources import ImportedTrace, Source, store_traces\n"
                "from alloctrace.traces.sources.base import ImportedTrace as I\nprint(ImportedTrace is I)")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] in ("[]", "['inspect']") and lines[1] == "True"  # inspect: dataclasses imports it
