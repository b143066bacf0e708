"""Every shared object `import`, `sweep` and `record` open (the command, its workers and the programs it
records) lies inside the installed package or the system's and Python's library folders: never in HOME (no
per-user cache) nor in $TMPDIR. Watched with strace, whose -y names the file behind each descriptor (a
library loaded from /proc/self/fd/N shows as the file it is)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.traces.sources.ggml_log import fastlog
from alloctrace.traces.sources.record import build, plans_fast
from alloctrace.traces.util import cbuild

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "ggml-real" / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"
PROGRAM = ROOT / "tests" / "data" / "record" / "exit3.py"
SWEEP_PROGRAM = ROOT / "tests" / "sweep_program.py"
OPENED = re.compile(r'openat\(.*\) = \d+<(.*)>$')
pytestmark = pytest.mark.skipif(not shutil.which("strace") or not sys.platform.startswith("linux"),
                                reason="needs strace on Linux")


def installed() -> dict[str, str]:
    """Each C part's library as setup.py names it, beside its source in the package."""
    return {stem: os.path.realpath(src.parent / cbuild.library_name(src, stem, flags))
            for src, stem, flags in ((fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS),
                                     (plans_fast.SOURCE, "plans_fast", cbuild.SHARED_FLAGS),
                                     (build.SOURCE, "recorder", cbuild.SHARED_FLAGS + ["-D_GNU_SOURCE"]))}


def system_folders() -> list[str]:
    found = ["/lib", "/lib32", "/lib64", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/local/lib",
             sys.base_prefix, sys.prefix]
    return [os.path.realpath(f) + "/" for f in found]


def shared_objects(args: list[str], tmp_path: Path, expect: int) -> set[str]:
    """The shared objects opened (successfully) while `alloctrace ARGS` ran, with every child process."""
    trace = tmp_path / "strace.txt"
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "ALLOCTRACE_PURE_PYTHON": "0"}
    env.pop("XDG_CACHE_HOME", None)
    res = subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=openat", "-e", "signal=none", "-o", str(trace),
                          sys.executable, "-m", "alloctrace", *args], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == expect, res.stderr[-2000:]
    out = set()
    for line in trace.read_text().splitlines():
        m = OPENED.search(line)
        if m and re.search(r"\.so(\.[\d.]+)?$", m.group(1)):
            out.add(m.group(1))
    assert out, "strace saw no shared object opened"
    return out


def assert_trusted_places(opened: set[str], tmp_path: Path) -> None:
    ours, system = set(installed().values()), system_folders()
    package_folders = {os.path.dirname(p) + "/" for p in ours}
    for path in opened:
        assert not path.startswith(str(tmp_path)), f"{path} was opened from HOME or $TMPDIR"
        if any(path.startswith(f) for f in package_folders):
            assert path in ours, f"{path} is in the package but is not one of its install-time libraries"
        else:
            assert any(path.startswith(f) for f in system), f"{path} lies outside the package and library folders"


def test_import_opens_only_the_packages_and_the_systems_libraries(tmp_path):
    opened = shared_objects(["import", str(LOG), "--store", str(tmp_path / "s")], tmp_path, 0)
    assert_trusted_places(opened, tmp_path)
    assert installed()["fastlog"] in opened  # the compiled reader ran, loaded from the package


def test_sweep_opens_only_the_packages_and_the_systems_libraries(tmp_path):
    opened = shared_objects(["sweep", "--store", str(tmp_path / "s"), "--vary=-c=128,256", "-j", "2", "--",
                             sys.executable, str(SWEEP_PROGRAM), "-nh", "2"], tmp_path, 0)
    assert_trusted_places(opened, tmp_path)
    assert {installed()["recorder"], installed()["plans_fast"]} <= opened  # preloaded and loaded from the package


def test_record_opens_only_the_packages_and_the_systems_libraries(tmp_path):
    opened = shared_objects(["record", "-o", str(tmp_path / "r.atrec"), "--", sys.executable, str(PROGRAM)],
                            tmp_path, 3)
    assert_trusted_places(opened, tmp_path)
    assert installed()["recorder"] in opened
