"""Untrusted bytes are decoded under a budget: a deeply nested pickle, a compression bomb under the old
2 GiB cap, ... are refused in one line (CLI exit 2, HTTP 4xx) and the server keeps answering."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hostile_inputs import codec_log_bomb, deep_tuple_snapshot, dense_snapshot_zstd, shared_long_string_snapshot

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "torch" / "gpt2_train_bs16.pickle.gz"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """In a child: a crash (SIGSEGV) shows as its exit status instead of killing the test run."""
    return subprocess.run([sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True,
                          timeout=timeout)


def one_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.startswith("alloctrace: error: ") and p.stderr.count("\n") == 1, p.stderr[-2000:]
    return p.stderr


@pytest.mark.parametrize("where,depth", [("filename", 200_000), ("size", 200_000), ("size", 1000)])
def test_a_deeply_nested_pickle_is_one_line(where, depth, tmp_path):
    """200 KB of nested tuples: exit 139 (SIGSEGV) before; 1,000 deep in a size: a numpy traceback."""
    path = deep_tuple_snapshot(tmp_path / "deep.pickle", depth, where)
    err = one_line(cli("import", str(path), "--store", str(tmp_path / "s")))
    assert "deep.pickle" in err and ("nested too deep" in err or "expected integers" in err), err


def test_the_server_refuses_a_deeply_nested_pickle_and_keeps_serving(tmp_path):
    path = deep_tuple_snapshot(tmp_path / "deep.pickle")
    prog = textwrap.dedent("""
        import sys
        from pathlib import Path
        from fastapi.testclient import TestClient
        from alloctrace.server.app import create_app
        with TestClient(create_app(store_dir=Path(sys.argv[2]))) as c:
            r = c.post("/api/torch/traces", files={"file": ("deep.pickle", Path(sys.argv[1]).read_bytes())})
            print(r.status_code, r.json()["detail"])
            print(c.get("/api/traces").status_code, c.get("/api/traces").json()["traces"])
    """)
    p = subprocess.run([sys.executable, "-c", prog, str(path), str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=300)  # a loaded CI machine: the bound is on the work, not the time
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    first, second = p.stdout.splitlines()
    assert first.startswith("422 ") and "nested too deep" in first, first
    assert second == "200 []"


@pytest.mark.parametrize("codec", ["gzip", "zstd", "xz"])
def test_a_compressed_file_past_the_default_budget_is_refused_in_one_line(codec, tmp_path):
    """72 MiB of log text in a few hundred KB: imported before (up to the old 2 GiB cap: a 37 KB zstd log
    took 2.8 GB and 103 s); refused at the 64 MiB default now, and --max-bytes moves the line."""
    path = codec_log_bomb(tmp_path / f"bomb.{codec}", codec)
    assert path.stat().st_size < 1 << 20
    err = one_line(cli("import", str(path), "--store", str(tmp_path / "s")))
    assert f"decompresses to more than {64 << 20:,} bytes" in err and "--max-bytes" in err, err
    err = one_line(cli("import", str(path), "--store", str(tmp_path / "s"), "--max-bytes", "1M"))
    assert f"more than {1 << 20:,} bytes" in err, err


def test_the_server_refuses_a_compressed_upload_past_the_budget_and_keeps_serving(tmp_path):
    from fastapi.testclient import TestClient

    from alloctrace.server.app import create_app

    path = codec_log_bomb(tmp_path / "bomb.zst", "zstd")
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        r = c.post("/api/traces", files={"file": ("bomb.zst", path.read_bytes())})
        assert r.status_code == 413 and "decompresses to more than" in r.json()["detail"], (r.status_code, r.text)
        assert c.get("/api/traces").json()["traces"] == []


def test_import_dir_passes_over_a_fifo_where_the_side_file_would_be(tmp_path):
    """A FIFO named like the recorder's `.json` beside a snapshot: `import DIR` waited on it forever."""
    import os
    import shutil

    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(FIXTURE, folder / "rank3.pickle.gz")
    os.mkfifo(folder / "rank3.json")
    try:
        p = cli("import", str(folder), "--store", str(tmp_path / "s"), "--json", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("import DIR hung on a FIFO side file")
    assert p.returncode == 0, p.stderr[-2000:]
    assert '"rank": 3' in p.stdout or "rank3" in p.stdout, p.stdout[-2000:]


def test_control_characters_in_frame_names_never_reach_the_svg():
    """A frame name from a snapshot with NUL, ESC or C1 characters made the flamegraph SVG unparsable."""
    import xml.etree.ElementTree as ET

    from alloctrace.traces.explain import torch_flame_svg

    name = "evil\x00\x1b[31m\x85\ud800<b>"
    leaf = {"name": name, "value": 4096, "count": 1, "children": []}
    tree = {"name": "all", "value": 4096, "count": 1, "children": [leaf]}
    f = {"tree": tree, "bytes": 4096, "trace_id": "t\x07", "device": 0, "event": 1, "n_events": 1,
         "live_allocations": 1, "name": "n\x0b"}
    svg = torch_flame_svg.svg(f)
    root = ET.fromstring(svg.encode("utf-8"))  # encodes and parses: nothing XML cannot carry
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
    assert "evil\\x00\\x1b[31m\\x85\\xd800<b>" in texts, texts


def test_ids_past_int64_are_one_line(tmp_path, capsys):
    """`trace:2**64` or `--device 2**64` reached the database driver: OverflowError and a traceback."""
    from alloctrace.cli import main

    store = str(tmp_path / "s")
    assert main(["import", str(FIXTURE), "--store", store]) == 0
    capsys.readouterr()
    from alloctrace.traces.store.store import open_store

    [t] = open_store(store).list()
    tid, big = t.id if hasattr(t, "id") else t["id"], str(1 << 64)
    for args in (["state", f"{tid}:{big}"], ["flame", f"{tid}:{big}"], ["whatif", f"{tid}:{big}"],
                 ["whatif", tid, "--device", big], ["diff", f"{tid}:{big}", tid]):
        assert main([*args, "--store", store]) == 3, args  # as for any graph the trace does not have
        err = capsys.readouterr().err
        assert err.startswith("alloctrace: error: ") and err.count("\n") == 1 and f"no graph {big}" in err, err


@pytest.mark.parametrize("damage,commands", [("extra='[]'", ("state", "flame", "whatif")), ("oom='[1]'", ("whatif",)),
                                              ("extra='not json'", ("state", "flame", "whatif"))])
def test_a_damaged_pytorch_graph_is_one_line_in_state_flame_and_whatif(damage, commands, tmp_path, capsys):
    """A device row whose extra or oom is not the JSON dict it was stored as: AttributeError tracebacks before."""
    import sqlite3

    from alloctrace.cli import main

    store = tmp_path / "s"
    assert main(["import", str(FIXTURE), "--store", str(store)]) == 0
    capsys.readouterr()
    db = sqlite3.connect(store / "alloctrace.db")
    db.execute(f"UPDATE graphs SET {damage}")
    db.commit()
    db.close()
    [tid] = [row.split()[0] for row in cli("list", "--store", str(store)).stdout.splitlines()[1:2]]
    for command in commands:
        assert main([command, tid, "--store", str(store)]) == 2, command
        err = capsys.readouterr().err
        assert err.startswith("alloctrace: error: ") and err.count("\n") == 1 and "is damaged" in err, (command, err)


def test_one_long_string_shared_by_every_frame_is_cut_at_import(tmp_path):
    """A 1 MB filename pickled once and named by every frame: the report of 2,000 such entries was 152 MB
    (134 s, 10 GB peak); each frame's text is cut to MAX_FRAME_TEXT characters at import, with a marker."""
    from alloctrace.traces.sources.torch.columns import MAX_FRAME_TEXT

    path = shared_long_string_snapshot(tmp_path / "long.pickle", n_entries=300)
    store = str(tmp_path / "s")
    p = cli("import", str(path), "--store", store)
    assert p.returncode == 0, p.stderr[-2000:]
    tid = re.search(r"^([0-9a-f]{8})  ", cli("list", "--store", store).stdout, re.M).group(1)
    out = tmp_path / "r.html"
    p = cli("report", tid, "-o", str(out), "--store", store, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    html = out.read_text()
    assert f"[cut: 1,048,576 characters, {MAX_FRAME_TEXT:,} kept]" in html
    assert len(html) < 16 << 20, len(html)  # 5 MB (its stacks shown hold about 2,500 frame texts); 152 MB uncut


def test_the_api_answers_carry_the_cut_frame_text_only(tmp_path):
    """Uploaded, the same snapshot's entries, peak and flame answers carry each frame's text cut, not 1 MB."""
    from fastapi.testclient import TestClient

    from alloctrace.server.app import create_app
    from alloctrace.traces.sources.torch.columns import MAX_FRAME_TEXT

    path = shared_long_string_snapshot(tmp_path / "long.pickle", n_entries=300)
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        r = c.post("/api/torch/traces", files={"file": ("long.pickle", path.read_bytes())})
        assert r.status_code == 201, r.text[:500]
        tid = r.json()["traces"][0]["id"]
        for view, params in (("entries", {"frames": "true", "limit": 300}), ("peak", {}), ("flame", {}),
                             ("state", {"event": 300})):
            r = c.get(f"/api/torch/traces/{tid}/devices/0/{view}", params=params)
            assert r.status_code == 200, (view, r.text[:500])
            # each entry: its frames' cut text, and with frames its flamegraph path (the same frames as labels)
            assert len(r.content) < 300 * 6 * (MAX_FRAME_TEXT + 200) + (1 << 20), (view, len(r.content))
            if view in ("entries", "peak"):
                assert "characters, 2,048 kept]" in r.text, view
        assert c.get("/api/traces").status_code == 200


def test_an_import_past_the_memory_budget_is_one_line(tmp_path):
    """The reading runs in a child under RLIMIT_AS: past ALLOCTRACE_MAX_IMPORT_MEMORY it is refused in one
    line naming the budget, and nothing is stored."""
    import os

    env = dict(os.environ, ALLOCTRACE_MAX_IMPORT_MEMORY="20M")
    p = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(FIXTURE), "--store", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=60, env=env)
    err = one_line(p)
    assert "refused: over the memory budget of 20,971,520 bytes (ALLOCTRACE_MAX_IMPORT_MEMORY raises it)" in err
    assert "gpt2_train_bs16.pickle.gz" in err
    p = cli("import", str(FIXTURE), "--store", str(tmp_path / "s"))  # the default budget reads it
    assert p.returncode == 0, p.stderr[-2000:]


def test_the_server_refuses_an_upload_past_the_memory_budget_and_keeps_serving(tmp_path):
    """150,000 entries of their own (8 MB of pickle, about 125 MB once unpickled) against a 64 MiB budget.
    The child, out of memory, spun in an exception handler until its 900 s CPU cap (CPython retries a handler
    whose entry needs memory); the server now ends a child that stays at its limit."""
    path = dense_snapshot_zstd(tmp_path / "dense.pickle.zst", 150_000)
    prog = textwrap.dedent("""
        import os, sys
        from pathlib import Path
        os.environ["ALLOCTRACE_MAX_IMPORT_MEMORY"] = "64M"
        from fastapi.testclient import TestClient
        from alloctrace.server.app import create_app
        with TestClient(create_app(store_dir=Path(sys.argv[2]))) as c:
            for _ in range(2):
                r = c.post("/api/torch/traces", files={"file": ("d.pickle.zst", Path(sys.argv[1]).read_bytes())})
                print(r.status_code, r.json()["detail"])
            print(c.get("/api/traces").status_code, c.get("/api/traces").json()["traces"])
    """)
    p = subprocess.run([sys.executable, "-c", prog, str(path), str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=300)  # a loaded CI machine: the bound is on the work, not the time
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    first, second, third = p.stdout.splitlines()
    assert first == second, (first, second)
    assert first == "413 d.pickle.zst: refused: over the memory budget of 67,108,864 bytes " \
        "(ALLOCTRACE_MAX_IMPORT_MEMORY raises it)", first
    assert third == "200 []"


def _spin_at_the_limit():
    """What CPython does out of memory in an exception handler, in Python: allocate, fail, try again."""
    keep = []
    while True:
        try:
            keep.append(bytearray(1 << 20))
        except MemoryError:
            pass


def test_a_child_that_spins_at_its_memory_limit_is_refused_for_memory_not_cpu():
    """Without the watch the child would run until its CPU cap and be refused for CPU time."""
    from alloctrace.traces.sources.bounded_io import LimitExceeded
    from alloctrace.traces.sources.child import read_in_child

    with pytest.raises(LimitExceeded) as e:
        read_in_child(_spin_at_the_limit, "spin.bin", 64 << 20, 120.0)
    assert str(e.value) == "spin.bin: refused: over the memory budget of 67,108,864 bytes " \
        "(ALLOCTRACE_MAX_IMPORT_MEMORY raises it)"


def test_a_child_that_waits_is_ended_at_the_wall_clock_cap():
    """Sleeping uses no CPU time: RLIMIT_CPU alone would let it hold an upload (and a thread) forever."""
    import time

    from alloctrace.traces.sources.bounded_io import LimitExceeded
    from alloctrace.traces.sources.child import read_in_child

    with pytest.raises(LimitExceeded) as e:
        read_in_child(lambda: time.sleep(3600), "slow.bin", 64 << 20, 0.5, wall_s=1)
    assert str(e.value).startswith("slow.bin: import took more than 1 s (wall-clock cap: twice the CPU cap"), e.value


def _write_pid_then_wait(path: str):
    import os
    import time

    Path(path).write_text(str(os.getpid()))
    time.sleep(3600)


@pytest.mark.parametrize("check", ["true", "raises"])
def test_a_reading_abandoned_while_its_child_runs_kills_and_reaps_it(check, tmp_path):
    """An import hashes the file while the child reads it; a file stored before abandons the reading: the
    child is killed and reaped (no zombie left), nothing is answered; a check that fails does the same."""
    import os
    import time

    from alloctrace.traces.sources.child import read_in_child

    marker = tmp_path / "pid"

    def abandon_if():
        while not marker.exists() or not marker.read_text():
            time.sleep(0.01)  # the child is running now
        if check == "raises":
            raise OSError("the store went away")
        return True

    started = time.monotonic()
    if check == "raises":
        with pytest.raises(OSError, match="the store went away"):
            read_in_child(lambda: _write_pid_then_wait(str(marker)), "f.log", 64 << 20, 60.0, abandon_if=abandon_if)
    else:
        assert read_in_child(lambda: _write_pid_then_wait(str(marker)), "f.log", 64 << 20, 60.0,
                             abandon_if=abandon_if) is None
    assert time.monotonic() - started < 30  # not the child's hour, nor the wall-clock cap
    with pytest.raises(ChildProcessError):
        os.waitpid(int(marker.read_text()), os.WNOHANG)  # reaped already


def test_a_file_stored_before_is_not_read_again(tmp_path, monkeypatch):
    """The retry of an import answers what it stored, and the second file of the same bytes is not read."""
    from alloctrace.traces.sources import import_files
    from alloctrace.traces.store.store import open_store

    log = Path(__file__).resolve().parents[1] / "data" / "ggml-real" / "v2023-08-28-parseseq" / \
        "gpt-2_tiny_short.AT.log"
    store = open_store(tmp_path / "s")
    [first] = import_files(store, [log])
    import alloctrace.traces.sources as sources

    reads = []
    real = sources._read_file
    monkeypatch.setattr(sources, "_read_file", lambda *a: reads.append(a) or real(*a))
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the reads are counted in this process
    copy = tmp_path / "copy.log"
    copy.write_bytes(log.read_bytes())
    again = import_files(store, [log, copy])
    assert [t["id"] for t in again] == [first["id"], first["id"]] and all(t["stored_before"] for t in again)
    assert reads == []
    assert len(store.trace_ids()) == 1


def test_the_import_fork_server_imports_nothing_from_the_working_folder(tmp_path):
    """Another user (uid 65534) plants numpy.py and zstandard.py in a shared folder the server was started in:
    `python -c` puts the working folder first on sys.path, so the fork server runs with the safe path (-P)."""
    import os
    import shutil

    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as a second user")
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="alloctrace-shared-", dir="/tmp"))  # /tmp/pytest-of-root is private
    shared.chmod(0o1777)
    planted = "import pathlib; pathlib.Path(__file__).with_suffix('.ran').write_text('ran')\n"
    for name in ("numpy.py", "zstandard.py"):
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                        f"printf %s \"$0\" > {shared / name}", planted], check=True)
    prog = textwrap.dedent("""
        import sys
        sys.path.remove("")  # this program itself must not import the planted files
        from pathlib import Path
        from fastapi.testclient import TestClient
        from alloctrace.server.app import create_app
        with TestClient(create_app(store_dir=Path(sys.argv[2]))) as c:
            r = c.post("/api/torch/traces", files={"file": ("g.pickle.gz", Path(sys.argv[1]).read_bytes())})
            print(r.status_code)
    """)
    p = subprocess.run([sys.executable, "-c", prog, str(FIXTURE), str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=120, cwd=shared)
    assert p.returncode == 0 and p.stdout.split() == ["201"], (p.stdout, p.stderr[-2000:])
    ran = sorted(f.name for f in shared.iterdir())
    shutil.rmtree(shared)
    assert ran == ["numpy.py", "zstandard.py"]
