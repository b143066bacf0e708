"""docs/architecture.md names files that exist: every row of "Where does my change go" names at least one
real file, and no path the page names (in backticks, from a top-level folder) is missing.

The page is where a new contributor starts; a row pointing at a file that moved sends them nowhere.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


# --- every module is named, every quoted signature exists --------------------------------------------------
MODULE_ROOTS = ("allocator", "metal_exec", "traces", "server")
DOCS = ROOT / "docs"


def modules() -> list[str]:
    """Every source module of the package's folders (and the CLI's own top-level modules), as repo paths;
    `__init__.py` files say what their room owns, so they are not listed; nor are the subcommands (one module
    each in alloctrace/commands/, listed by `alloctrace --help`)."""
    out = []
    for top in MODULE_ROOTS:
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in (".py", ".c", ".js") and p.name != "__init__.py" and "examples" not in p.parts \
                    and "__pycache__" not in p.parts:
                out.append(p.relative_to(ROOT).as_posix())
    out += [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "alloctrace").glob("*.py"))
            if p.name != "__init__.py"]
    return out


def python_modules() -> list[str]:
    """modules() and the subcommands: where a quoted Python signature may be defined."""
    inits = [p.relative_to(ROOT).as_posix() for top in (*MODULE_ROOTS, "alloctrace")
             for p in sorted((ROOT / top).rglob("__init__.py")) if "examples" not in p.parts]
    return [p for p in modules() if p.endswith(".py")] + inits + \
        [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "alloctrace" / "commands").glob("*.py"))]


def rows_by_folder(text: str) -> dict[str, str]:
    """Table rows whose first two cells name a folder (`traces/store/`), by that folder: the row's whole text."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        head = "|".join(line.strip().strip("|").split("|")[:2])  # the room, or a source's name and module
        for folder in re.findall(r"`([\w/.-]+/)`", head):
            out[folder] = out.get(folder, "") + line
    return out


def is_named(path: str, text: str, rows: dict[str, str]) -> bool:
    """A module is named by its whole path anywhere on the page, or by its file name (in backticks, with or
    without a qualifier after a colon or a space) in its folder's row."""
    if f"`{path}" in text:
        return True
    folder, name = path.rsplit("/", 1)
    row = rows.get(folder + "/", "")
    stem = name.rsplit(".", 1)[0] if name.endswith(".py") else name  # `detect` names detect.py
    return re.search(rf"`(?:{re.escape(name)}|{re.escape(stem)})[`:( ]", row) is not None


def test_every_module_is_named_in_the_architecture_page():
    text = DOC.read_text()
    rows = rows_by_folder(text)
    unnamed = [p for p in modules() if not is_named(p, text, rows)]
    assert unnamed == [], f"docs/architecture.md does not name: {unnamed}"


def test_an_unnamed_module_is_caught():
    rows = rows_by_folder("| `traces/store/` | `schema.py` (TraceMeta), `store.py` |\n")
    assert is_named("traces/store/store.py", "", rows)
    assert not is_named("traces/store/blobs.py", "", rows)
    assert is_named("traces/store/blobs.py", "see `traces/store/blobs.py`", {})


def definitions() -> dict[str, tuple[set[str], bool]]:
    """Every function and class of the package by name: (the keyword names it declares, whether it also takes
    any other keyword through **kwargs)."""
    import ast

    found: dict[str, tuple[set[str], bool]] = {}
    for path in python_modules():
        for node in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(node, ast.ClassDef):
                names, anything = _class_fields(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names, anything = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}, a.kwarg is not None
            else:
                continue
            prior_names, prior_any = found.get(node.name, (set(), False))
            found[node.name] = (prior_names | names, prior_any or anything)
    return found


def _class_fields(node) -> tuple[set[str], bool]:
    """What a class's constructor takes: its annotated fields (a dataclass) and its __init__'s arguments."""
    import ast

    names: set[str] = set()
    anything = False
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            anything = item.args.kwarg is not None
            names |= {x.arg for x in item.args.args + item.args.kwonlyargs}
    return names, anything


SIGNATURE = re.compile(r"`(?:[\w.]+\.)?([A-Za-z_]\w*)\(([^`]*)\)`")
PY_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
PY_SIGNATURE = re.compile(r"^(?:[\w.]+\.)?([A-Za-z_]\w*)\((.*)\)", re.M)


def _keywords(args: str) -> list[str]:
    return re.findall(r"(?<![\w.=])([A-Za-z_]\w*)\s*=(?!=)", args)


def quoted_calls(text: str) -> list[tuple[str, list[str]]]:
    """(function, keyword names) of every call quoted in backticks: `open_store(path, readonly=True)`."""
    return [(name, _keywords(args)) for name, args in SIGNATURE.findall(text)]


def block_signatures(text: str) -> list[tuple[str, list[str]]]:
    """(function, keyword names) of each signature a ```python block shows as the package's API."""
    return [(name, _keywords(args)) for block in PY_BLOCK.findall(text) for name, args in PY_SIGNATURE.findall(block)]


def test_every_signature_quoted_in_the_docs_exists():
    """A call quoted in backticks takes the keywords it shows (when the package defines it: the docs also
    quote PyTorch, C and the browser); a signature in a ```python block is the package's: it exists and each
    keyword it shows is one the function declares (what **kwargs passes on is shown as `**options`)."""
    defs = definitions()
    wrong = []
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        shown = block_signatures(text)
        wrong += [f"{doc.name}: {name}() is not defined in the package" for name, _ in shown
                  if name not in defs and name not in NOT_OURS]
        for name, keywords in quoted_calls(text):
            declared, anything = defs.get(name, (set(), True))
            wrong += [f"{doc.name}: {name}() takes no {k}" for k in keywords if not anything and k not in declared]
        for name, keywords in shown:
            declared, _ = defs.get(name, (set(), True))
            wrong += [f"{doc.name}: {name}() declares no {k}" for k in keywords
                      if name in defs and k not in declared]
    assert wrong == []


# what ```python blocks in the docs call that is Python's or PyTorch's, not the package's
NOT_OURS = {"print", "_set_memory_metadata", "_dump_snapshot", "_record_memory_history"}


def test_a_wrong_keyword_is_caught():
    assert quoted_calls("see `Store.add_trace(meta, graphs, buffered=True)` and `x == y`") == \
        [("add_trace", ["buffered"])]
    assert block_signatures("```python\nimport_file(store, src, *, buffered=False) -> list\n```") == \
        [("import_file", ["buffered"])]


# --- what the code's docstrings and comments point at exists -----------------------------------------------
CODE_PATH = re.compile(r"(?<![\w/.])((?:allocator|traces|server|metal_exec|alloctrace|web|tests|bench|docs|ci)/"
                       r"[\w/.-]*\.(?:py|c|js|md|html|sh|yml))\b")
ROOM_PATH = re.compile(r"(?<![\w/.])([a-z_]+/[\w/.-]*\.(?:py|c|js))\b")


def stale_references(path: Path) -> list[str]:
    """Paths a source file names that lead nowhere: from the repository's root, from traces/ (rooms name each
    other's files as `store/columns.py`), or from the file's own folder or its parent."""
    text = path.read_text(errors="replace")
    bases = (ROOT, ROOT / "traces", ROOT / "traces" / "sources", path.parent, path.parent.parent)
    out = []
    for ref in sorted(set(CODE_PATH.findall(text)) | set(ROOM_PATH.findall(text))):
        if ref.startswith("alloctrace/") and (ROOT / ref.removeprefix("alloctrace/")).exists():
            continue  # the installed layout's name of a mapped folder
        if ref.startswith("alloctrace/") and "/_" in ref:
            continue  # a module a test plants in a laid-out copy
        if not any((b / ref).exists() for b in bases) and not ref.startswith(("ggml/", "torch/")):  # theirs
            out.append(ref)
    return out


def test_docstrings_and_comments_name_files_that_exist():
    stale = {p: refs for p in modules() if (refs := stale_references(ROOT / p))}
    assert stale == {}


def test_a_stale_docstring_is_caught(tmp_path):
    f = tmp_path / "mod.py"
    f.write_text('"""Reads what traces/store/columns.py wrote, as traces/state.py did."""\n')
    assert stale_references(f) == ["traces/state.py"]
