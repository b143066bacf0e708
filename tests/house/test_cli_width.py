"""CLI tables fit the terminal (traces/util/fit_width.py) while a pipe gets every character; read commands
never make a store a mistyped --store names."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from alloctrace.traces.util.fit_width import fit_rows, middle_cut

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "server" / "examples" / "harness_plain-ggml-2023-08-16.AT.log"
LONG = "a trace name long enough to overflow any sensible terminal all by itself, and then some more"


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("width") / "store"
    for i in range(2):
        r = cli("import", str(LOG), "--store", str(d), "--name", f"{LONG} {i}", "--tag", f"config=cfg-{i}" * 3)
        assert r.returncode == 0, r.stderr
    return d


def test_middle_cut_keeps_both_ends():
    cut = middle_cut("llama-completion-tiny.gguf", 12)
    assert len(cut) == 12 and cut.startswith("llama") and cut.endswith("gguf") and "…" in cut
    assert middle_cut("short", 12) == "short"


def test_free_text_gives_way_first():
    rows = [["ID", "NAME", "CREATED"], ["abcd1234", "n" * 60, "2026-12-04T00:31:12+00:00"]]
    fitted = fit_rows(rows, 60)
    assert fitted[1][2] == rows[1][2]  # the date is whole: the name gave way
    assert max(len("  ".join(r)) for r in fitted) <= 60
    assert fit_rows(rows, None) == rows


def test_a_pipe_gets_whole_names_whatever_columns_says(store):
    """Scripts read tables through pipes (the README's tour does): $COLUMNS never cuts them."""
    for env in ({"COLUMNS": "80"}, {}):
        r = cli("list", "--store", str(store), env=env)
        assert r.returncode == 0 and f"{LONG} 1" in r.stdout and "…" not in r.stdout
    full = cli("list", "--store", str(store), "--json")
    assert LONG in full.stdout and json.loads(full.stdout)


def in_a_pty(argv: list[str], columns: int, env_columns: str | None) -> tuple[bytes, int]:
    """argv's output and exit status with a pseudo-terminal `columns` x 40 as its stdout ($COLUMNS unset, or
    `env_columns`)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if env_columns:
        env["COLUMNS"] = env_columns
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdout is the terminal
        os.execvpe(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    return out, os.waitstatus_to_exitcode(status)


def on_a_terminal(store, columns: int, env_columns: str | None = None) -> list[str]:
    """`alloctrace list` under a pseudo-terminal sized `columns` x 40, as a person's shell would run it."""
    out, status = in_a_pty([sys.executable, "-m", "alloctrace", "list", "--store", str(store)], columns, env_columns)
    assert status == 0
    return [ln for ln in out.decode().replace("\r", "").splitlines() if ln.strip()]


def test_a_real_terminal_of_90_columns(store):
    lines = on_a_terminal(store, 90)
    assert len(lines) == 3 and max(map(len, lines)) <= 90, lines
    assert any("…" in ln for ln in lines)
    assert all("12,320" in ln for ln in lines[1:])  # numbers are never cut
    tid = json.loads(cli("list", "--store", str(store), "--json").stdout)["traces"][0]["id"]
    assert any(ln.startswith(tid + " ") for ln in lines)  # nor ids


def test_columns_names_the_width_on_a_terminal(store):
    lines = on_a_terminal(store, 200, env_columns="70")
    assert len(lines) == 3 and max(map(len, lines)) <= 70, lines


@pytest.mark.parametrize("command", [["list"], ["show", "deadbeef"], ["peak", "deadbeef"], ["rm", "deadbeef"],
                                     ["doctor"], ["export", "deadbeef", "--format", "csv"]])
def test_read_commands_never_make_a_store(tmp_path, command):
    typo = tmp_path / "sotre"
    r = cli(*command, "--store", str(typo))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"alloctrace: error: no store at {typo} (import, record, sweep or fit makes one; " \
                               f"check --store or $ALLOCTRACE_STORE)"
    assert not typo.exists()


def test_import_makes_the_store_and_a_file_argument_may_too(tmp_path):
    made = tmp_path / "new"
    assert cli("import", str(LOG), "--store", str(made)).returncode == 0
    assert (made / "traces.db").is_file() or any(made.iterdir())
    other = tmp_path / "other"
    r = cli("peak", f"{LOG}:0", "--store", str(other))  # a file to import on the fly: the store is made for it
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("columns, env_columns", [(90, None), (0, None), (200, "70"), (120, "wide")])
def test_the_width_is_shutils_without_shutil(columns, env_columns):
    """fit_width.terminal_width reads the terminal as shutil.get_terminal_size does (a 0-column terminal: 80;
    a $COLUMNS that is no number: the terminal's), without importing shutil."""
    code = ("import sys; from alloctrace.traces.util.fit_width import terminal_width as w; "
            "mine = w(); had = 'shutil' in sys.modules; import shutil; "
            "print(mine, shutil.get_terminal_size().columns, had)")
    out, _ = in_a_pty([sys.executable, "-c", "import sys; sys.modules.pop('shutil', None); " + code], columns,
                      env_columns)
    mine, theirs, had = out.decode().split()
    assert mine == theirs == str(int(env_columns) if (env_columns or "").isdigit() else columns or 80)
    assert had == "False"
