"""Install the project as the README says (a plain `pip install .` of a copy of the tree, in a fresh virtual
environment), then run every command's --help and the README's quick tour, parsed from the README itself.

The virtual environment sees the system's site-packages so dependencies need no download; the project
itself must come from the fresh, non-editable install (checked).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def code_block(heading: str, lang: str) -> str:
    """The first ```lang block after a heading line ('# alloctrace', '## Quick tour') of the README."""
    section = re.split(rf"^#+ {re.escape(heading)}\n", README, maxsplit=1, flags=re.M)[1]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


def tree_files() -> list[str]:
    """What a clone holds: tracked files and new files git does not ignore."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             check=True, capture_output=True).stdout.decode()
        return [f for f in out.split("\0") if f and (ROOT / f).is_file()]
    pytest.skip("not a git checkout: cannot tell which files a clone holds")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "alloctrace-src"
    for rel in tree_files():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    install = code_block("alloctrace", "sh").splitlines()[0]
    assert install == "pip install .", "the README's first command changed: update this test"
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "."], cwd=src,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    shutil.rmtree(src / "build", ignore_errors=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("ALLOCTRACE_STORE", "DISPLAY", "WAYLAND_DISPLAY", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HOME=str(tmp / "home"))
    where = subprocess.run(["python", "-c", "import alloctrace; print(alloctrace.__file__)"], cwd=tmp, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv), f"alloctrace imported from {where}, not the fresh install"
    return src, env


def run(cmd, cwd, env, **kw):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, **kw)


def test_every_package_of_the_tree_is_installed(installed, tmp_path):
    """Each folder with an __init__.py under a mapped folder is a package of the install (found by discovery,
    not a list), and web/ ships inside the server package."""
    import tomllib

    src, env = installed
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = {"alloctrace": "alloctrace", **mapping}
    want, tracked = [], set(tree_files())
    for name, folder in mapping.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder).parts
            if "tests" not in rel and init.relative_to(ROOT).as_posix() in tracked:
                want.append(".".join((name, *rel)))
    assert "alloctrace.commands" in want and "alloctrace.allocator.presets" in want
    probe = ("import importlib.util, json, sys; "
             "print(json.dumps([n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]))")
    res = run(["python", "-c", probe, *want], tmp_path, env)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr
    web = run(["python", "-c", "from alloctrace.server import paths; print(paths.find_web_dir())"], tmp_path, env)
    assert Path(web.stdout.strip(), "trace.html").is_file() and "site-packages" in web.stdout


def test_every_command_has_help(installed):
    src, env = installed
    res = run(["alloctrace", "no-such-command"], src, env)
    assert res.returncode == 2
    commands = re.findall(r"'([\w-]+)'", res.stderr.split("choose from", 1)[1])
    top = run(["alloctrace", "--help"], src, env)
    assert top.returncode == 0
    assert {"replay", "import", "diff", "check", "serve", "record", "sweep", "fit", "flame", "report", "compare"} <= set(commands)
    for name in commands:
        assert re.search(rf"^\s+{name}\b", top.stdout, re.M), f"{name} missing from alloctrace --help"
        res = run(["alloctrace", name, "--help"], src, env)
        assert res.returncode == 0, f"alloctrace {name} --help: {res.stderr}"
        assert res.stdout.startswith(f"usage: alloctrace {name}"), res.stdout[:200]
        if name in ("sweep", "fit"):  # the pre-flight commands show how they are called
            assert "Examples:\n  " in res.stdout and "--vary=-c=" in res.stdout
        if name in ("flame", "record", "report"):  # PyTorch's recorder and flamegraph show how they are called
            assert "Examples:\n  " in res.stdout and f"alloctrace {name} " in res.stdout.split("Examples:")[1]


def tour_lines() -> list[tuple[str, int]]:
    """(command line, expected exit status) for each command of the quick tour; a comment saying
    'exit status N' on the line or on the comment lines just above it sets N."""
    out, notes = [], []
    for line in code_block("Quick tour", "sh").splitlines():
        if not line.strip():
            notes = []
        elif line.lstrip().startswith("#"):
            notes.append(line)
        else:
            found = re.findall(r"exit status (\d+)", " ".join(notes + [line.partition("  #")[2]]))
            out.append((line, int(found[-1]) if found else 0))
            notes = []
    return out


def test_quick_tour_runs_as_written(installed):
    src, env = installed
    lines = [(cmd, rc) for cmd, rc in tour_lines() if not cmd.startswith("alloctrace serve")]
    assert len(lines) >= 8 and any(rc == 3 for _, rc in lines) and any(rc == 1 for _, rc in lines)
    script = []
    for cmd, rc in lines:
        script += [cmd, f'rc=$?; [ "$rc" = {rc} ] || {{ echo "exit status $rc, not {rc}: "{shlex.quote(cmd)} >&2; exit 1; }}']
    t0 = time.monotonic()
    res = run(["bash", "-c", "\n".join(script)], src, env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert time.monotonic() - t0 < 90, "the quick tour must stay quick"
    assert (src / "trace.json").stat().st_size > 1000
    assert "my run" in res.stdout and "FIRST DIVERGENCE" in res.stdout
    assert "numeric run equals the reference" in res.stdout


def test_python_snippet_runs_as_written(installed):
    src, env = installed
    snippet = code_block("Using the model from Python", "python")
    res = run(["python", "-P", "-c", snippet], src, env)  # as the README says
    assert res.returncode == 0, res.stderr
    expected = re.search(r"print\(measure\.t\.max_size\)\s*#\s*(\d+)", snippet).group(1)
    assert res.stdout.splitlines()[0] == expected


def test_serve_open_without_a_display_prints_the_url(installed):
    src, env = installed
    [serve] = [cmd for cmd, _ in tour_lines() if cmd.startswith("alloctrace serve")]
    port = free_port()
    argv = shlex.split(serve.partition("  #")[0]) + ["--port", str(port)]
    p = subprocess.Popen(argv, cwd=src, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        lines = []  # what it says first: the examples it stored (the tour's store gets them), then where it serves
        while not lines or "no display" not in lines[-1] and len(lines) < 6:
            lines.append(p.stdout.readline().strip())
        assert lines[-1] == f"alloctrace: no display to open a browser on; open {url} in a browser", lines
        assert f"alloctrace: serving on {url}" in lines
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200 and b"alloctrace" in r.read()
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_the_installed_log_import_runs_compiled(installed, tmp_path):
    """`pip install .` compiles the fast log importer into the package (a C compiler is there), so the
    installed import runs compiled, loaded from the package; nothing is built on use."""
    src, env = installed
    probe = ("import sys; from alloctrace.traces.sources.ggml_log.import_log import LogImport; "
             "from alloctrace.traces.sources.ggml_log import fastlog; "
             "from alloctrace.traces.util import cbuild; "
             "imp = LogImport(sys.argv[1]); n = sum(1 for _ in imp.encoded()); print(imp.fast, n, cbuild.LOADED['fastlog'])")
    log = ROOT / "tests" / "data" / "ggml-real" / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"
    cache = tmp_path / "cache"
    res = run(["python", "-c", probe, str(log)], tmp_path,
              {**env, "ALLOCTRACE_PURE_PYTHON": "0", "XDG_CACHE_HOME": str(cache)})
    fast, n, lib = res.stdout.split()
    assert res.returncode == 0 and (fast, n) == ("True", "6"), res.stdout + res.stderr
    where = Path(lib)
    assert where.parent.name == "ggml_log" and "site-packages" in where.parts and where.name.startswith("fastlog-")
    assert not (cache / "alloctrace").exists()  # nothing was built on first use


def test_the_installed_recording_replay_runs_compiled(installed, tmp_path):
    """`pip install .` ships plans_fast.c and compiles it into the package: a recorded dry run's reserve is
    replayed by the compiled path, loaded from the package, nothing built on first use."""
    src, env = installed
    probe = ("import io, lzma, sys; from alloctrace.traces.sources.record import plans_fast; "
             "from alloctrace.traces.sources.record.source import SOURCE; "
             "data = lzma.decompress(open(sys.argv[1], 'rb').read()); taken = []; real = plans_fast.reserve; "
             "plans_fast.reserve = lambda *a, **k: taken.append(real(*a, **k)) or taken[-1]; "
             "(t,) = SOURCE.read(io.BytesIO(data), filename='x', name=None); "
             "from alloctrace.traces.util import cbuild; "
             "print(len(taken), taken[0] is not None, t.graphs[0].consistent, cbuild.LOADED['plans_fast'])")
    rec = ROOT / "tests" / "data" / "record" / "fit" / "tiny-llama-c4096-faoff.atrec.xz"
    cache = tmp_path / "cache"
    res = run(["python", "-c", probe, str(rec)], tmp_path, {**env, "XDG_CACHE_HOME": str(cache)})
    assert res.returncode == 0, res.stderr
    n, took, consistent, lib = res.stdout.split()
    assert (n, took, consistent) == ("1", "True", "True")
    where = Path(lib)
    assert where.parent.name == "record" and "site-packages" in where.parts and where.name.startswith("plans_fast-")
    assert not (cache / "alloctrace").exists()


def test_the_installed_recorder_needs_no_cache(installed, tmp_path):
    """`pip install .` also compiles the recorder (its default build needs no header of the program), so
    `record` loads it from the package, never from a cache another user might have reached first."""
    src, env = installed
    probe = "from alloctrace.traces.sources.record.build import recorder_library; print(recorder_library())"
    cache = tmp_path / "cache"
    res = run(["python", "-c", probe], tmp_path, {**env, "XDG_CACHE_HOME": str(cache)})
    assert res.returncode == 0, res.stderr
    where = Path(res.stdout.strip())
    assert where.parent.name == "record" and "site-packages" in where.parts and where.name.startswith("recorder-")
    assert not (cache / "alloctrace").exists()
