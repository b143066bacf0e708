"""Compiled code is loaded only from the installed package, checked on the file that is then loaded; there is
no per-user cache; the recorder's output files are made only in the run's private folder, until collected.

The attacks run with a second, unprivileged uid (65534, through setpriv), as the victim or as the attacker:
a planted library writes a marker file when it is loaded, and each test asserts the marker is absent and the
victim's files unchanged. They need root to set up the two users (CI runs as root)."""
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

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "tests" / "data" / "record" / "exit3.py"  # allocates one graph, exits 3
LOG = ROOT / "tests" / "data" / "ggml-real" / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"
NOBODY = 65534
RECORDER = cbuild.library_name(build.SOURCE, "recorder", cbuild.SHARED_FLAGS + ["-D_GNU_SOURCE"])
FASTLOG = cbuild.library_name(fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS)
EXPORTS = ("ggml_gallocr_new_n", "ggml_gallocr_alloc_graph", "ggml_gallocr_reserve_n", *fastlog.SYMBOLS)
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


def as_attacker(*argv: str) -> None:
    """`argv` run as uid 65534 (the other, unprivileged user)."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv], check=True,
                   env={"PATH": os.environ["PATH"]}, cwd="/", timeout=60)


def listing(folder: Path) -> dict:
    """Every file under `folder` with its bytes (links as their target)."""
    return {str(p.relative_to(folder)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


# --- as a second user --------------------------------------------------------------------------------------
def test_a_library_planted_in_the_shared_temporary_folder_is_never_loaded(world):
    """The old fallback for a read-only HOME: $TMPDIR/alloctrace-<uid>, a name anyone can create first."""
    marker = world / "out" / "planted-ran"
    for name in (RECORDER, FASTLOG):
        plant(world / "tmp" / f"alloctrace-{NOBODY}" / name, marker)
    (world / "tmp" / f"alloctrace-{NOBODY}").chmod(0o777)
    res = as_nobody(world, "record", "-o", "r.atrec", "--", "PYTHON", str(world / "in" / PROGRAM.name))
    assert res.returncode == 3, res.stderr  # recorded
    assert (world / "out" / "r.atrec").stat().st_size > 0
    res = as_nobody(world, "import", str(world / "in" / LOG.name), "--store", "store")
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


def test_the_per_user_cache_is_gone_what_is_in_it_never_runs_and_nothing_is_left_behind(world):
    """A library in ~/.cache/alloctrace passing every check the cache made (the user's own, 0700, exporting
    the symbols) is what an attacker who swapped the cache's folder between the check and the load got
    run. Now the cache is never looked at: the victim's files are untouched, the recorder is the package's
    or is built into a private folder that is removed afterwards."""
    marker = world / "out" / "planted-ran"
    home = world / "home"
    cache = home / ".cache" / "alloctrace"
    for name in (RECORDER, FASTLOG):
        plant(cache / name, marker)
    for path in [home, home / ".cache", *cache.parent.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    cache.chmod(0o700)
    before = listing(home)
    res = as_nobody(world, "record", "-o", "r.atrec", "--", "PYTHON", str(world / "in" / PROGRAM.name))
    assert res.returncode == 3, res.stderr
    assert (world / "out" / "r.atrec").stat().st_size > 0
    res = as_nobody(world, "import", str(world / "in" / LOG.name), "--store", "store")
    assert res.returncode == 0, res.stderr
    assert not marker.exists()
    assert listing(home) == before
    assert list((world / "tmp").iterdir()) == []  # no build folder, no record folder left


def test_a_detached_child_cannot_write_through_a_link_planted_after_the_run(world):
    """The recorded program leaves a child running after it exits. Once `record` has collected its results
    and removed its folder, the attacker recreates the record folder's path with a link to the victim's file
    named as the child's recording; the child then uses ggml again. Before: it followed the link and
    appended its recording to the victim's file. Its own children do not inherit the recorder either."""
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as a second user")
    victim = world / "victim.txt"
    victim.write_text("the victim's file\n")
    go, info = world / "go", world / "info"
    prog = ROOT / "tests" / "data" / "record" / "detach_later.py"
    env = {**os.environ, "TMPDIR": str(world / "tmp")}
    res = subprocess.run([sys.executable, "-m", "alloctrace", "record", "-o", str(world / "r.atrec"), "--",
                          sys.executable, str(prog), str(go), str(info)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    import json

    child = json.loads(info.read_text())
    folder = Path(child["dir"])
    assert folder.is_relative_to(world / "tmp") and not folder.exists()  # collected, then removed
    as_attacker("mkdir", "-p", str(folder))
    as_attacker("ln", "-s", str(victim), str(folder / f"rec-{child['pid']}.atrec"))
    go.touch()
    for _ in range(600):
        if Path(f"{info}.done").exists():
            break
        import time

        time.sleep(0.05)
    assert Path(f"{info}.done").exists(), "the detached child did not finish"
    assert victim.read_text() == "the victim's file\n"
    assert sorted(p.name for p in folder.iterdir()) == [f"rec-{child['pid']}.atrec"]  # nothing new there
    late_env = Path(f"{info}.env").read_text()
    assert "ALLOCTRACE_RECORD_DIR" not in late_env and "recorder-" not in late_env


# --- as this user ------------------------------------------------------------------------------------------
def _package_copy(folder: Path, source: Path, stem: str, flags) -> Path:
    """The install-time library of `source` copied into `folder` under its installed name."""
    real = cbuild.installed_path(source, stem, flags)
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / real.name
    shutil.copy2(real, copy)
    return copy


def test_a_library_swapped_after_its_checks_is_not_what_runs(monkeypatch, tmp_path):
    """The checks are made on the open file, and that open file is loaded: replacing the file at the path
    right after the checks (what winning the old race gave) changes nothing."""
    marker = tmp_path / "planted-ran"
    copy = _package_copy(tmp_path / "pkg", fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS)
    real_open = cbuild.open_trusted

    def open_then_swap(path, symbols=()):
        fd = real_open(path, symbols)
        plant(tmp_path / "planted.so", marker)
        os.replace(tmp_path / "planted.so", path)
        return fd

    monkeypatch.setattr(cbuild, "installed_path", lambda *a: copy)
    monkeypatch.setattr(cbuild, "open_trusted", open_then_swap)
    monkeypatch.setattr(cbuild, "_OPENED", {})
    monkeypatch.setattr(fastlog._FAST, "_tried", [])
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    lib = fastlog.library()
    assert lib is not None and not marker.exists()
    assert main(["import", str(LOG), "--store", str(tmp_path / "s")]) == 0
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["folder-writable", "parent-writable", "file-writable", "link", "empty",
                                    "no-symbols"])
def test_a_library_that_fails_a_check_is_never_loaded(monkeypatch, tmp_path, damage):
    """Each check of cbuild.open_trusted: import then reads on the Python path and says why."""
    top = tmp_path / "top"
    copy = _package_copy(top / "pkg", fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS)
    if damage == "folder-writable":
        copy.parent.chmod(0o777)
    elif damage == "parent-writable":  # the package folder itself could be swapped by renaming it
        top.chmod(0o777)
    elif damage == "file-writable":
        copy.chmod(0o777)
    elif damage == "link":
        os.replace(copy, top / "elsewhere.so")
        copy.symlink_to(top / "elsewhere.so")
        monkeypatch.setattr(cbuild.os.path, "realpath", lambda p: str(p))  # the link is met while walking
    elif damage == "empty":
        copy.write_bytes(b"")
    else:
        src = tmp_path / "other.c"
        src.write_text("int something_else(void) { return 1; }\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(copy), str(src)], check=True)
    monkeypatch.setattr(cbuild, "installed_path", lambda *a: copy)
    monkeypatch.setattr(cbuild, "_OPENED", {})
    monkeypatch.setattr(fastlog._FAST, "_tried", [])
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    assert fastlog.library() is None
    why = {"folder-writable": "writable by other users", "parent-writable": "writable by other users",
           "file-writable": "writable by other users", "link": "cannot open", "empty": "has 0 bytes",
           "no-symbols": "does not export fl_sizeof"}[damage]
    assert why in fastlog.unavailable()
    assert main(["import", str(LOG), "--store", str(tmp_path / "s")]) == 0


def test_without_an_install_time_recorder_record_builds_a_private_one_and_removes_it(tmp_path):
    """No recorder in the package: a fresh private folder holds a build for this command only."""
    tmp = tmp_path / "t"
    tmp.mkdir()
    code = ("import sys; from alloctrace.traces.sources.record import build; "
            "from alloctrace.traces.util import cbuild; cbuild.installed_path = lambda *a: cbuild.Path(sys.argv[1]); p = build.recorder_library(); "
            "print(p, oct(p.parent.stat().st_mode & 0o777))")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing.so")], capture_output=True, text=True,
                         env={**os.environ, "TMPDIR": str(tmp)}, timeout=120)
    assert res.returncode == 0, res.stderr
    built, mode = res.stdout.split()
    built = Path(built)
    assert built.parent.parent == tmp and built.parent.name.startswith("alloctrace-lib-") and mode == "0o700"
    assert list(tmp.iterdir()) == []  # removed when the command ended


def test_no_private_folder_is_one_line_for_record_and_the_python_path_for_import(monkeypatch, tmp_path, capsys):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cbuild, "installed_path", lambda *a: tmp_path / "missing.so")
    monkeypatch.setattr(cbuild, "_PRELOADS", {})
    monkeypatch.setattr(cbuild, "_OPENED", {})
    monkeypatch.setattr(tempfile, "mkdtemp", full)  # cbuild imports it when it builds
    monkeypatch.setattr(fastlog._FAST, "_tried", [])
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    assert main(["record", "-o", str(tmp_path / "r"), "--", "/bin/true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloctrace: error: cannot build the recorder") and err.count("\n") == 1
    assert "pip install ." in err
    assert main(["import", str(LOG), "--store", str(tmp_path / "s")]) == 0
    assert fastlog.library() is None  # read by the pure Python path


def test_a_package_path_with_a_space_is_not_handed_to_the_loader(monkeypatch, tmp_path, capsys):
    """LD_PRELOAD="/x/a b/..." is read as "/x/a" and "b/...", the second relative to the program's folder:
    the recorder is then built into a private folder instead."""
    copy = _package_copy(tmp_path / "a b", build.SOURCE, "recorder", cbuild.RECORDER_FLAGS)
    monkeypatch.setattr(cbuild, "installed_path", lambda *a: copy)
    monkeypatch.setattr(cbuild, "_PRELOADS", {})
    path = build.recorder_library()
    assert path != copy and cbuild.preload_safe(path)
    assert main(["record", "-o", str(tmp_path / "r"), "--", "/bin/true"]) == 2
    assert "no ggml allocator calls" in capsys.readouterr().err


def test_an_unsafe_preload_path_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="LD_PRELOAD"):
        run.run_recorded(["true"], Path("/tmp/a:b.so"), tmp_path)
    with pytest.raises(UserError, match="LD_PRELOAD"):
        run.run_recorded(["true"], Path("relative.so"), tmp_path)


def test_ctypes_mirrors_have_the_size_of_their_c_structs():
    """Both C sides export their structs' sizes; a mirror that differs fails loudly when loaded."""
    import ctypes

    from alloctrace.traces.sources.record import plans_fast

    lib = fastlog.library()
    assert lib is not None and plans_fast.library() is not None
    cbuild.check_sizes(lib, "fl_sizeof", {"GraphOut": fastlog.GraphOut})
    cbuild.check_sizes(plans_fast.library()[0], "rf_sizeof", {"RfIn": plans_fast.RfIn, "RfOut": plans_fast.RfOut})

    class Shorter(ctypes.Structure):
        _fields_ = fastlog.GraphOut._fields_[:-1]

    with pytest.raises(AssertionError, match="GraphOut is .* bytes in C but .* in Python"):
        cbuild.check_sizes(lib, "fl_sizeof", {"GraphOut": Shorter})


def test_import_verbose_says_which_path_read(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ALLOCTRACE_PURE_PYTHON", "0")
    # what earlier tests in this process loaded (or faked) is not what this command finds
    monkeypatch.setattr(cbuild, "_OPENED", {})
    monkeypatch.setattr(cbuild, "LOADED", {})
    monkeypatch.setattr(fastlog._FAST, "_tried", [])
    assert main(["import", "--verbose", str(LOG), "--store", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    lib = os.path.realpath(cbuild.installed_path(fastlog.SOURCE, "fastlog", cbuild.SHARED_FLAGS))
    assert f"alloctrace: ggml logs: the compiled path, loaded from {lib}\n" in err
    monkeypatch.setattr(cbuild, "installed_path", lambda *a: tmp_path / "missing.so")
    monkeypatch.setattr(cbuild, "_OPENED", {})
    monkeypatch.setattr(fastlog._FAST, "_tried", [])
    assert main(["import", "-v", str(LOG), "--store", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert f"alloctrace: ggml logs: the pure Python path (cannot open {tmp_path}/missing.so: No such file" in err
