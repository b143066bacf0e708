"""What `alloctrace record` of a ggml program loads: its fixed cost is mostly Python's imports (bench/
bench_record_start.py measures it), so the record path must not pull in what it never uses: the dashboard's
and the API's libraries (pydantic, rich), the PostgreSQL backend for a store that is a folder, OpenSSL's hash
module for a recording of a few kilobytes, logging, email, the standard library's HTTP and asyncio, nor
`dataclasses` and `inspect` (the record path's classes are allocator/record_class.py's), and it reads a small
recording of its own without a child process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alloctrace.traces.store.store import open_store

HERE = Path(__file__).resolve().parents[1]
PROGRAM = [sys.executable, str(HERE / "sweep_program.py"), "-nh", "2"]
# the command as the console script runs it, then the names of the modules it loaded (cli.console runs the
# atexit handlers before it ends the process); not those the interpreter had loaded before it (site's .pth
# files in a development environment load tempfile, for one)
NOTED = """import atexit, sys
out = sys.argv.pop(1)
before = set(sys.modules)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(set(sys.modules) - before))))
import gc
atexit.register(lambda: open(out + ".gc", "w").write(f"{gc.isenabled()} {gc.get_freeze_count() > 0}"))
sys.argv[0] = "alloctrace"
from alloctrace.entry import console
console()
"""
NEVER = ("pydantic", "rich", "psycopg", "psycopg_pool", "alloctrace.traces.store.postgres", "hashlib", "logging",
         "email", "http", "asyncio", "numpy", "urllib.request", "alloctrace.server", "dataclasses", "inspect",
         "pickle",  # pickle: a child's answer (sources/child.py), which a small recording of its own skips
         "argparse", "gettext", "tempfile", "shutil", "random", "bz2", "lzma",  # the usual command line is
         # read without argparse (commands/record.py args_from), the run's folder made and removed without
         # tempfile and shutil (which import random, bz2 and lzma)
         "subprocess", "selectors", "locale")  # the program the entry point started: a fork and exec of its
# own (traces/sources/early.py spawn), and nothing else on the path starts one


def test_recording_a_ggml_program_loads_none_of_the_heavy_modules(tmp_path):
    noted = tmp_path / "modules"
    run = subprocess.run([sys.executable, "-c", NOTED, str(noted), "record", "--ggml", "--store",
                          str(tmp_path / "store"), "--", *PROGRAM], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (trace,) = open_store(str(tmp_path / "store")).list()
    assert trace["graphs"] and trace["name"] == Path(sys.executable).name
    modules = set(noted.read_text().split())
    assert "alloctrace.traces.sources.record.source" in modules  # the recording was read in this process's code
    print(sorted(modules))
    loaded = sorted(m for m in modules if m in NEVER or m.split(".")[0] in NEVER)
    assert loaded == []
    # zstandard's compiled module, without the package's __init__ and what it imports (traces/util/zstd.py)
    assert "zstandard.backend_c" in modules and not {"zstandard", "typing", "platform"} & modules
    # the collector, paused while the command imported itself (traces/util/gcpause.py), ran again after
    assert (tmp_path / "modules.gc").read_text() == "True True"
