"""The `alloctrace` command as users start it (`python -m alloctrace`; the console script calls the same
`cli.console`), which ends the process without the interpreter's teardown: so these run it as a process of
its own and check what the ordinary exit gave: exit statuses, output flushed into a pipe, a reader that has
gone, a closed stdout, atexit handlers, threads still running, and the SQLite store whose WAL it leaves for
the next command to read (the PostgreSQL store closes its pool)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from alloctrace import __version__
from alloctrace.cli import main
from alloctrace.traces.store import postgres
from alloctrace.traces.store.store import DB_NAME, open_store

LOG = Path(__file__).resolve().parents[1] / "data" / "ggml-real" / "head-gallocr" / "gpt-2-alloc_tiny_short.AT.log"
# block-buffered stdout, as in a pipe without PYTHONUNBUFFERED: what is not flushed is lost
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def alloctrace(*args, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run([sys.executable, "-m", "alloctrace", *args], stderr=subprocess.PIPE, text=True, env=ENV,
                          timeout=120, **kwargs)


def console(script: str, *args) -> subprocess.CompletedProcess:
    """`script` run, then `cli.console()` with `args` as the command line, in a process of its own."""
    code = f"import sys\n{script}\nsys.argv = ['alloctrace', *{list(args)!r}]\nfrom alloctrace.cli import console\nconsole()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)


def test_exit_statuses_and_one_line_errors_are_those_of_main(tmp_path):
    ok = alloctrace("--version")
    assert (ok.returncode, ok.stdout.strip()) == (0, f"alloctrace {__version__}")
    open_store(tmp_path / "s").close()
    gone = alloctrace("rm", "nosuch", "--store", str(tmp_path / "s"))
    assert (gone.returncode, gone.stderr) == (3, "alloctrace: error: no trace 'nosuch'\n")
    typo = alloctrace("rm", "nosuch", "--store", str(tmp_path / "typo"))
    assert typo.returncode == 2 and typo.stderr.startswith(f"alloctrace: error: no store at {tmp_path / 'typo'} ")
    bad = alloctrace("sweep", "--store", str(tmp_path / "s"))
    assert bad.returncode == 2 and bad.stderr.startswith("alloctrace: error: sweep: ") and bad.stderr.count("\n") == 1
    usage = alloctrace("presets", "--no-such-option")
    assert usage.returncode == 2 and "unrecognized arguments" in usage.stderr


def test_buffered_output_is_flushed_whole(capsys):
    assert main(["presets"]) == 0
    expected = capsys.readouterr().out
    run = alloctrace("presets")
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout == expected and len(expected) > 1000


def test_a_reader_that_has_gone_is_not_an_error():
    read, write = os.pipe()
    os.close(read)  # as `alloctrace presets | head -0` once head has ended
    try:
        run = alloctrace("presets", stdout=write)
    finally:
        os.close(write)
    assert (run.returncode, run.stderr) == (0, "")  # not Python's "Exception ignored ... BrokenPipeError", 120


def test_a_closed_stdout():
    run = subprocess.run([sys.executable, "-m", "alloctrace", "presets"], stderr=subprocess.PIPE, text=True,
                         env=ENV, timeout=120, preexec_fn=lambda: os.close(1))
    assert (run.returncode, run.stderr) == (0, "")


def test_atexit_handlers_run_and_what_they_print_is_flushed():
    run = console("import atexit\natexit.register(print, 'at exit')", "presets")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("llama-7b") and run.stdout.endswith("at exit\n")


def test_a_thread_still_running_ends_as_with_the_ordinary_exit(tmp_path):
    script = ("import threading, time\n"
              "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done', flush=True))).start()")
    open_store(tmp_path / "s").close()
    run = console(script, "rm", "nosuch", "--store", str(tmp_path / "s"))
    assert run.returncode == 3  # no such trace: a one-line error
    assert run.stdout == "thread done\n"  # the ordinary exit waits for it; os._exit would not


def test_a_sqlite_store_left_with_its_wal_is_read_back_whole_by_the_next_command(tmp_path):
    store = tmp_path / "store"
    imp = alloctrace("import", str(LOG), "--store", str(store), "--json")
    assert imp.returncode == 0, imp.stderr
    imported = json.loads(imp.stdout)["traces"]
    wal = store / f"{DB_NAME}-wal"
    assert wal.stat().st_size > 0  # the quick exit left the WAL: its transactions are not in the database file
    listed = alloctrace("list", "--store", str(store), "--json")
    assert listed.returncode == 0, listed.stderr
    (trace,) = json.loads(listed.stdout)["traces"]
    assert trace["id"] == imported[0]["id"]
    assert [g["max_size"] for g in trace["graphs"]] == [g["max_size"] for g in imported[0]["graphs"]] == [147520]
    doctor = alloctrace("doctor", "--store", str(store), "--json")
    assert doctor.returncode == 0, doctor.stderr  # every trace reads back: metadata, tags, columns
    s = open_store(store)
    try:
        assert s.summary(trace["id"])["graphs"][0]["n_events"] == imported[0]["graphs"][0]["n_events"] == 547
    finally:
        s.close()


def test_a_postgresql_store_closes_its_pool_at_exit(pg_url):
    imp = alloctrace("import", str(LOG), "--store", pg_url, "--json")
    assert imp.returncode == 0, imp.stderr
    listed = alloctrace("list", "--store", pg_url, "--json")
    assert [t["id"] for t in json.loads(listed.stdout)["traces"]] == [json.loads(imp.stdout)["traces"][0]["id"]]
    store = open_store(pg_url)
    pool = store._be.pool
    assert not pool.closed
    postgres._close_open_pools()  # what the exit runs (the ordinary one and the CLI's alike)
    assert pool.closed
