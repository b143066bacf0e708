"""`alloctrace diff` on stored refs and on log files imported on the fly."""
import json
import subprocess
import sys

import pytest

from alloctrace.cli import main
from alloctrace.traces import import_paths
from alloctrace.traces.store.store import open_store


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "alloctrace", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def stored_ids(path):
    s = open_store(path)
    try:
        return [t["id"] for t in s.list()]
    finally:
        s.close()


@pytest.fixture()
def legacy_log(fixtures):
    return fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log"


def test_log_file_graphs_report_the_divergence_and_the_oom(legacy_log, tmp_path):
    r = run_cli("diff", f"{legacy_log}:0", f"{legacy_log}:1", "--store", tmp_path)
    assert r.returncode == 1, r.stderr
    out = r.stdout
    assert "FIRST DIVERGENCE" in out and "tensor KQV" in out
    assert "OUT OF SPACE" in out and "needed 4096 B" in out and "largest free block is 2064 B" in out
    # one import for both refs
    assert len(stored_ids(tmp_path)) == 1


def test_json_output_of_stored_refs(legacy_log, tmp_path, capsys):
    s = open_store(tmp_path)
    (tid,) = import_paths(s, [legacy_log])
    s.close()
    assert main(["diff", f"{tid}:0", f"{tid}:1", "--store", str(tmp_path), "--json"]) == 1
    js = json.loads(capsys.readouterr().out)
    assert js["first_divergence"]["tensor"] == "KQV" and js["b"]["oom"]["needed"] == 4096


def test_fixed_allocator_exits_zero(fixtures, tmp_path):
    log = fixtures / "v2023-08-28-parseseq" / "harness_plain.AT.log"
    r = run_cli("diff", f"{log}:0", f"{log}:1", "--store", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no divergence" in r.stdout


def test_whole_trace_report(fixtures, tmp_path):
    a = fixtures / "v2023-08-16-legacy" / "gpt-2_tiny_short.AT.log"
    b = fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"
    r = run_cli("diff", a, b, "--store", tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert "graph pairs" in r.stdout and r.stdout.count("graph 0 vs 0") >= 1


@pytest.mark.parametrize("refs,code", [(["nosuch/file.log", "abc"], 2), (["ffffffff", "ffffffff:0"], 3),
                                        (["notanid!", "x"], 3)])
def test_bad_refs_are_one_line_errors(tmp_path, refs, code):
    from alloctrace.traces.store.store import open_store

    open_store(tmp_path).close()  # an empty store: the refs name nothing in it
    r = run_cli("diff", *refs, "--store", tmp_path)
    assert r.returncode == code
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""
