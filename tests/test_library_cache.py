"""The compiled-library cache never loads code another user (or a damaged build) left there.

The planted-library attacks run as a second, unprivileged uid (65534, through setpriv) with a read-only HOME,
as a hostile local user would find a victim: the planted library writes a marker file when it is loaded, and
each test asserts the marker is absent. They need root to set up the two users (CI runs as root)."""
from __future__ import annotations

import errno
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.util import cbuild
from alloctrace.traces.errors import UserError
from alloctrace.traces.sources.record import build, run
from alloctrace.traces.sources.ggml_log import fastlog

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "data" / "record" / "exit3.py"  # allocates one graph, exits 3
LOG = ROOT / "tests" / "data" / "ggml-real" / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"
NOBODY = 65534
RECORDER = cbuild.library_name(build.SOURCE, "recorder", cbuild.SHARED_FLAGS + ["-D_GNU_SOURCE"])
FASTLOG = cbuild.library_name(fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS)
EXPORTS = ("ggml_gallocr_new_n", "ggml_gallocr_alloc_graph", "ggml_gallocr_reserve_n", "fl_new", "fl_free",
           "fl_release", "fl_reason", "fl_feed", "fl_queued", "fl_features", "fl_configure", "fl_next", "fl_tune")
PLANTED_C = """#include <stdio.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
""" + "".join(f"void {s}(void) {{}}\n" for s in EXPORTS)
cc = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(not cc or not sys.platform.startswith("linux"), reason="needs Linux and cc")


def plant(path: Path, marker: Path, mode: int = 0o755):
    """A library exporting every symbol ours do, that writes `marker` when loaded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.with_suffix(".c")
    src.write_text(PLANTED_C % marker)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(path), str(src)], check=True)
    src.unlink()
    path.chmod(mode)


@pytest.fixture
def world():
    """A folder every user can read (pytest's tmp_path is private to root): HOME read-only to the second
    user, a shared sticky temporary folder, `out` it can write, and `in` with copies of the program and log
    it runs (the clone itself may sit in a folder only its owner can enter)."""
    top = Path(tempfile.mkdtemp(prefix="alloctrace-trust-", dir="/tmp"))
    top.chmod(0o755)
    for name, mode in (("home", 0o755), ("tmp", 0o1777), ("out", 0o777), ("in", 0o755)):
        (top / name).mkdir()
        (top / name).chmod(mode)
    for src in (PROGRAM, LOG):
        (top / "in" / src.name).write_bytes(src.read_bytes())
        (top / "in" / src.name).chmod(0o644)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def as_nobody(world: Path, *args: str, tmpdir: Path | None = None, **env) -> subprocess.CompletedProcess:
    """`python -m alloctrace ARGS` as uid 65534, HOME = world/home (which it cannot write). PYTHONPATH passes
    through: where this Python's packages are private to root, a readable copy of them can be named there."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run as a second user")
    python, pythonpath = _readable_python()
    base = {"PATH": os.environ["PATH"], "HOME": str(world / "home"), "TMPDIR": str(tmpdir or world / "tmp"),
            "PYTHONDONTWRITEBYTECODE": "1", "ALLOCTRACE_PURE_PYTHON": "0", **env}
    if pythonpath:
        base["PYTHONPATH"] = pythonpath
    user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python]
    probe = subprocess.run([*user, "-c", PROBE], env=base, cwd=world, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot import this Python's packages: {probe.stderr.strip().splitlines()[-1]}")
    args = [probe.stdout.strip() if a == "PYTHON" else a for a in args]
    return subprocess.run([*user, "-m", "alloctrace", *args], cwd=world / "out", env=base,
                          capture_output=True, text=True, timeout=300)


_READABLE: list = []


def _runs_as_nobody(python: str, pythonpath: str | None) -> bool:
    env = {"PATH": os.environ["PATH"], **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    try:
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c",
                            PROBE], env=env, cwd="/", capture_output=True, text=True, timeout=120)
    except OSError:
        return False
    return r.returncode == 0


def _distributions(name: str, seen: dict) -> None:
    """`name` and what it needs at run time (no extras), as installed here."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return
    if key in seen:
        return
    seen[key] = dist
    for req in dist.requires or []:
        if "extra ==" not in req:
            _distributions(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0], seen)


def _readable_python() -> tuple[str, str | None]:
    """A Python and PYTHONPATH with which uid 65534 imports this checkout: this process's own where that user
    can run it, else (CI installs into a Python under root's private home) the system Python of the same
    version over a world-readable copy of the package and of the distributions it needs (made once)."""
    if _READABLE:
        return _READABLE[0]
    inherited = os.environ.get("PYTHONPATH")
    if _runs_as_nobody(sys.executable, inherited):
        _READABLE.append((sys.executable, inherited))
        return _READABLE[0]
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(system):
        pytest.skip(f"uid {NOBODY} cannot run {sys.executable} and there is no {system}")
    site = Path(tempfile.mkdtemp(prefix="alloctrace-nobody-site-", dir="/tmp"))
    site.chmod(0o755)
    seen: dict = {}
    for name in ["alloctrace", "ggml-python"]:
        _distributions(name, seen)
    for key, dist in seen.items():
        if key == "alloctrace":
            continue
        for top in {f.parts[0] for f in dist.files or [] if not f.parts[0].endswith((".dist-info", ".pth"))}:
            src = Path(dist.locate_file(top))
            dest = site / top
            if dest.exists() or not src.exists() or top == "..":
                continue
            if src.is_dir():
                shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
            else:
                shutil.copy2(src, dest)
    # this checkout laid out as an install lays it out (pyproject's package-dir)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    shutil.copytree(ROOT / "alloctrace", site / "alloctrace", ignore=ignore)
    for folder, sub in (("allocator", "allocator"), ("metal_exec", "metal_exec"), ("traces", "traces"),
                        ("server", "server"), ("web", "server/web")):
        shutil.copytree(ROOT / folder, site / "alloctrace" / sub, ignore=ignore, dirs_exist_ok=True)
    for path in site.rglob("*"):
        path.chmod(path.stat().st_mode | 0o444 | (0o111 if path.is_dir() else 0))
    if not _runs_as_nobody(system, str(site)):
        pytest.skip(f"uid {NOBODY} cannot import the package even from a readable copy ({site})")
    _READABLE.append((system, str(site)))
    return _READABLE[0]


# the Python the second user can start a program with (this one's path may lead through a folder it cannot read)
# (the program it records must import ggml too: a Python started from there is asked as well)
PROBE = ("import os, shutil, subprocess, sys, ggml; from alloctrace.traces.sources import registered; registered(); "
         "py = sys.executable if os.path.exists(sys.executable) else shutil.which('python3'); "
         "subprocess.run([py, '-c', 'import ggml'], check=True); print(py)")


# --- as a second user, HOME read-only --------------------------------------------------------------------
def test_a_library_planted_in_the_shared_temporary_folder_is_never_loaded(world):
    """The old fallback for a read-only HOME: $TMPDIR/alloctrace-<uid>, a name anyone can create first."""
    marker = world / "out" / "planted-ran"
    for name in (RECORDER, FASTLOG):
        plant(world / "tmp" / f"alloctrace-{NOBODY}" / name, marker)
    (world / "tmp" / f"alloctrace-{NOBODY}").chmod(0o777)
    res = as_nobody(world, "record", "-o", "r.atrec", "--", "PYTHON", str(world / "in" / PROGRAM.name))
    assert res.returncode == 3, res.stderr  # recorded, with a recorder built in a private folder
    assert (world / "out" / "r.atrec").stat().st_size > 0
    res = as_nobody(world, "import", str(world / "in" / LOG.name), "--store", "store")
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


def test_a_cache_folder_of_another_user_is_never_loaded_from(world):
    marker = world / "out" / "planted-ran"
    cache = world / "home" / ".cache" / "alloctrace"
    for name in (RECORDER, FASTLOG):
        plant(cache / name, marker)
    cache.chmod(0o777)  # writable by the victim too, but not the victim's
    res = as_nobody(world, "record", "-o", "r.atrec", "--", "PYTHON", str(world / "in" / PROGRAM.name))
    assert res.returncode == 3, res.stderr
    res = as_nobody(world, "import", str(world / "in" / LOG.name), "--store", "store")
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


# --- as this user --------------------------------------------------------------------------------------
def test_a_full_or_read_only_cache_is_one_line_for_record_and_the_python_path_for_import(monkeypatch, tmp_path,
                                                                                        capsys):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cbuild, "private_cache", lambda: None)  # read-only (root could write it anyway)
    monkeypatch.setattr(cbuild.tempfile, "mkdtemp", full)
    monkeypatch.setattr(fastlog, "_LIB", [])
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    assert main(["record", "-o", str(tmp_path / "r"), "--", "/bin/true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: cannot build the recorder") and err.count("\n") == 1
    assert main(["import", str(LOG), "--store", str(tmp_path / "s")]) == 0
    assert fastlog.library() is None  # read by the pure Python path


def test_a_zero_byte_cached_recorder_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "alloctrace").mkdir(mode=0o700)
    (tmp_path / "alloctrace" / RECORDER).write_bytes(b"")
    path = build.recorder_library()
    assert path.stat().st_size > 0 and cbuild.trusted_library(path, frozenset({os.getuid()}), build.SYMBOLS)


def test_a_cached_library_without_its_symbols_is_rebuilt(monkeypatch, tmp_path):
    """Before: an AttributeError traceback when the fast reader bound its functions."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    monkeypatch.setattr(fastlog, "_LIB", [])
    (tmp_path / "alloctrace").mkdir(mode=0o700)
    src = tmp_path / "other.c"
    src.write_text("int something_else(void) { return 1; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "alloctrace" / FASTLOG), str(src)], check=True)
    lib = fastlog.library()
    assert lib is not None and hasattr(lib, "fl_next")


@pytest.mark.parametrize("folder_mode,file_mode", [(0o770, 0o755), (0o777, 0o755), (0o700, 0o775)])
def test_a_cache_or_file_others_can_write_is_not_loaded(monkeypatch, tmp_path, folder_mode, file_mode):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    marker = tmp_path / "planted-ran"
    plant(tmp_path / "alloctrace" / RECORDER, marker, file_mode)
    (tmp_path / "alloctrace").chmod(folder_mode)
    path = build.recorder_library()
    assert path != tmp_path / "alloctrace" / RECORDER or folder_mode == 0o700  # private folder: rebuilt in place
    assert cbuild.trusted_library(path, frozenset({os.getuid()}), build.SYMBOLS)
    assert main(["record", "-o", str(tmp_path / "r"), "--", "/bin/true"]) == 2  # no ggml calls, but ran
    assert not marker.exists()


def test_a_cache_path_with_a_space_is_not_split_by_the_loader(monkeypatch, tmp_path, capsys):
    """LD_PRELOAD="/x/a b/..." is read as "/x/a" and "b/...", the second relative to the program's folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a b"))
    marker = tmp_path / "planted-ran"
    plant(tmp_path / "b" / "alloctrace" / RECORDER, marker)
    monkeypatch.chdir(tmp_path)
    assert main(["record", "-o", str(tmp_path / "r"), "--", "/bin/true"]) == 2
    assert "no ggml allocator calls" in capsys.readouterr().err
    assert not marker.exists()
    assert cbuild.preload_safe(build.recorder_library())


def test_an_unsafe_preload_path_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="LD_PRELOAD"):
        run.run_recorded(["true"], Path("/tmp/a:b.so"), tmp_path)
    with pytest.raises(UserError, match="LD_PRELOAD"):
        run.run_recorded(["true"], Path("relative.so"), tmp_path)
