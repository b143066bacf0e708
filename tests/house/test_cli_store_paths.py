"""Which store a command reads: a mistyped --store is an error for commands that read (only those that add
traces make a store), and `replay` stores into $ALLOCTRACE_STORE like every other command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.traces.store.store import DB_NAME

LOG = Path(__file__).resolve().parents[1] / "data" / "ggml-real" / "v2023-08-16-legacy" / "harness_plain.AT.log"


def alloctrace(*args, env=None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "ALLOCTRACE_STORE"} | (env or {})
    return subprocess.run([sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True, env=full,
                          timeout=120)


@pytest.mark.parametrize("command", [["list"], ["show", "0000dead"], ["rm", "0000dead"], ["doctor"],
                                     ["diff", "0000dead:0", "0000dead:1"], ["export", "0000dead", "--format", "csv"],
                                     ["peak", "0000dead:0"]])
def test_a_read_command_on_a_mistyped_store_says_so_and_creates_nothing(tmp_path, command):
    missing = tmp_path / "stroe"
    run = alloctrace(*command, "--store", str(missing))
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"alloctrace: error: no store at {missing} ") and run.stderr.count("\n") == 1
    assert not missing.exists()


def test_the_same_through_the_environment_and_import_still_makes_one(tmp_path):
    store = tmp_path / "store"
    assert alloctrace("list", env={"ALLOCTRACE_STORE": str(store)}).returncode == 2
    imp = alloctrace("import", str(LOG), "--json", env={"ALLOCTRACE_STORE": str(store)})
    assert imp.returncode == 0, imp.stderr and (store / DB_NAME).exists()
    listed = alloctrace("list", "--json", env={"ALLOCTRACE_STORE": str(store)})
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["traces"]) == 1


def test_replay_stores_into_the_store_of_the_environment(tmp_path):
    store = tmp_path / "store"
    env = {"ALLOCTRACE_STORE": str(store)}
    rep = alloctrace("replay", "--preset", "llama-7b", "--profile", "ggml-2023-08-16", "--json", env=env)
    assert rep.returncode in (0, 3), rep.stderr
    stored = json.loads(rep.stdout)["measure"]["trace_id"]
    listed = json.loads(alloctrace("list", "--json", env=env).stdout)["traces"]
    assert [t["id"] for t in listed] == [stored]
