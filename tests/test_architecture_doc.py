"""docs/architecture.md names files that exist: every row of "Where does my change go" names at least one
real file, and no path the page names (in backticks, from a top-level folder) is missing.

The page is where a new contributor starts; a row pointing at a file that moved sends them nowhere.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
TOP = ("allocator/", "alloctrace/", "bench/", "docs/", "metal_exec/", "server/", "tests/", "traces/", "web/")
FILES = ("pyproject.toml", "README.md", "setup.py")


def named_paths(text: str) -> list[str]:
    """Backticked paths from a top-level folder (`traces/store/store.py`, `tests/conftest.py: log_records`),
    without what follows a colon; placeholders (`<name>`) are left out."""
    out = []
    for token in re.findall(r"`([^`]+)`", text):
        path = token.split(":")[0].strip()
        if "<" in path or " " in path:
            continue
        if path.startswith(TOP) or path in FILES:
            out.append(path)
    return out


def change_rows() -> list[tuple[str, str]]:
    text = DOC.read_text()
    section = text.split("## Where does my change go", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and line.startswith("|") and not set(cells[0]) <= {"-"} and cells[0] != "change":
            rows.append((cells[0], cells[1]))
    return rows


def test_every_change_row_names_a_real_file():
    rows = change_rows()
    assert len(rows) >= 8
    for change, touch in rows:
        files = [p for p in named_paths(touch) if (ROOT / p).is_file()]
        assert files, f"row {change!r} names no existing file"


def test_every_path_the_page_names_exists():
    missing = [p for p in named_paths(DOC.read_text()) if not (ROOT / p).exists()]
    assert missing == []


def test_a_moved_file_is_caught():
    assert named_paths("see `traces/state.py` and `tests/conftest.py: log_records` and `alloctrace/commands/<name>.py`") \
        == ["traces/state.py", "tests/conftest.py"]
    assert not (ROOT / "traces/state.py").exists()
