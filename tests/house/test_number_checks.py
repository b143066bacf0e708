"""A text checked before int() reads it is checked with str.isdecimal: str.isdigit also takes superscripts and
other digit signs ('¹', '²'), which int() refuses with a ValueError, so a request or a command line holding one
answered a 500 or a traceback where it should have been refused in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("allocator", "traces", "server", "alloctrace", "metal_exec")


def test_no_module_checks_a_number_with_isdigit():
    found = [f"{p.relative_to(ROOT)}:{n}" for d in PACKAGE for p in sorted((ROOT / d).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if ".isdigit()" in line]
    assert found == []
    assert "¹".isdigit() and not "¹".isdecimal()   # why: int("¹") raises


def test_a_superscript_in_a_request_or_a_command_line_is_refused_in_one_line(tmp_path):
    from alloctrace.server.app import create_app

    with TestClient(create_app(str(tmp_path / "store"))) as c:
        r = c.get("/api/sweep", params={"preset": "x", "profile": "y", "n_ctx": "¹"})
    assert r.status_code in (400, 422) and "n_ctx" in r.text
    script = tmp_path / "t.py"
    script.write_text("print('never run')\n")
    cli = subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--vary", "batch=¹..8", "--budget", "1GiB",
                          "--", "python", str(script), "{batch}"], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 2 and cli.stderr.startswith("alloctrace: error:") and cli.stderr.count("\n") == 1
