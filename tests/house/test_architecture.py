"""The import contracts in pyproject.toml ([tool.importlinter]) hold: no package imports a layer above it, and
inside traces/ no room imports a room above it or beside it (sources and exporters; replay and pre-flight).

The sub-packages live in top-level folders mapped into `alloctrace` (pyproject's package-dir), which
the import graph builder cannot follow in an editable install; so the test lays the package out as
a wheel would (a copy of the .py files) and runs lint-imports over that copy.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAPPED = {"allocator": "allocator", "traces": "traces", "server": "server", "metal_exec": "metal_exec"}


def lay_out(dest: Path, extra: dict[str, str] | None = None) -> Path:
    """The installed package tree under dest (only .py files); `extra` adds files (relative path -> text)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "examples")
    shutil.copytree(ROOT / "alloctrace", dest / "alloctrace", ignore=ignore)
    for folder, sub in MAPPED.items():
        shutil.copytree(ROOT / folder, dest / "alloctrace" / sub, ignore=ignore)
    for rel, text in (extra or {}).items():
        (dest / rel).write_text(text)
    return dest


def lint(tree: Path) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def test_import_contracts_hold(tmp_path):
    r = lint(lay_out(tmp_path))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in r.stdout


@pytest.mark.parametrize("rel,line,contract", [
    ("alloctrace/allocator/_upward.py", "from alloctrace.traces import store\n", "Data flows one way"),
    ("alloctrace/metal_exec/_upward.py", "import alloctrace.traces.replay.run\n", "Data flows one way"),
    ("alloctrace/traces/sources/ggml_log/_cross.py", "from alloctrace.traces.sources import jsonl\n",
     "Trace sources are independent"),
    ("alloctrace/traces/sources/torch/_cross.py", "from alloctrace.traces.sources.record import stream\n",
     "Trace sources are independent"),
    ("alloctrace/traces/store/_upward.py", "from alloctrace.traces.state import index\n", "Inside traces"),
    ("alloctrace/traces/sources/_sideways.py", "from alloctrace.traces.export import ggml\n", "Inside traces"),
    ("alloctrace/traces/whatif/_upward.py", "from alloctrace.traces.state import torch_blocks\n", "Inside traces"),
    ("alloctrace/traces/state/_upward.py", "def later():\n    from alloctrace.traces.explain import peak\n",
     "Inside traces"),
    # the faces ask traces/ use cases, never the models: a route or a command that decides with allocator/
    ("alloctrace/server/_decides.py", "from alloctrace.allocator.profiles import PROFILES\n", "Faces only translate"),
    ("alloctrace/commands/_decides.py", "def later():\n    from alloctrace.metal_exec import hazards\n",
     "Faces only translate"),
])
def test_an_upward_import_breaks_a_contract(tmp_path, rel, line, contract):
    r = lint(lay_out(tmp_path, {rel: textwrap.dedent(line)}))
    assert r.returncode != 0
    assert contract in r.stdout and "BROKEN" in r.stdout
