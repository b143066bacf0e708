"""The server finds web/ and its example logs both from a built package and from the checkout,
and `--examples` seeds an empty store once."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from alloctrace.server import paths
from alloctrace.server.examples import example_logs, seed_examples
from alloctrace.traces.store.store import open_store

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import json; from alloctrace.server import paths, examples; "
         "print(json.dumps({'web': str(paths.find_web_dir()), 'logs': [str(p) for p in examples.example_logs()]}))")


def test_checkout_serves_the_repository_web_folder():
    # editable installs and plain checkouts: server/ sits beside web/
    assert paths.find_web_dir() == ROOT / "web"
    assert [p.parent for p in example_logs()] == [ROOT / "server" / "examples"]


def test_built_package_carries_web_and_examples(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                                              "tests", "bench", ".pytest_cache"))
    out = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(out)],
                   cwd=src, check=True, capture_output=True)
    # a fresh interpreter without site-packages sees only the built tree, as after `pip install .`
    res = subprocess.run([sys.executable, "-S", "-c", PROBE], cwd=tmp_path, env={"PYTHONPATH": str(out)},
                         check=True, capture_output=True, text=True)
    found = json.loads(res.stdout)
    web = Path(found["web"])
    assert web == out / "alloctrace" / "server" / "web"
    for f in (ROOT / "web").iterdir():
        if f.is_file():
            assert (web / f.name).read_bytes() == f.read_bytes()
    assert [Path(p).name for p in found["logs"]] == [p.name for p in example_logs()]
    assert all(Path(p).is_relative_to(out) for p in found["logs"])


def test_seed_examples_fills_an_empty_store_once(tmp_path, fixtures):
    store = open_store(tmp_path)
    ids = seed_examples(store)
    traces = {t["id"]: t for t in store.list()}
    assert set(ids) == set(traces) and len(ids) == 3
    replays = sorted((t for t in traces.values() if t["source"] == "replay"), key=lambda t: t["generation"])
    assert [t["generation"] for t in replays] == ["ggml-2023-08-16", "ggml-2023-08-28"]
    assert all("llama2-70b" in t["tags"] for t in replays)
    old, new = (t["graphs"][1] for t in replays)
    assert old["oom"] is not None and new["oom"] is None  # the Aug 16 best fit runs out; Aug 28 fits
    [log] = [t for t in traces.values() if t["source"] == "ggml-log"]
    assert log["graphs"][1]["oom"] == {"tensor": "fc_b", "needed": 4096, "largest_available": 2064}
    shipped = example_logs()[0].read_bytes()
    assert shipped == (fixtures / "v2023-08-16-legacy" / "harness_plain.AT.log").read_bytes()
    assert seed_examples(store) == []
    assert len(store.list()) == 3


def test_a_store_with_traces_of_its_own_gets_the_examples_it_lacks(tmp_path, fixtures):
    """The README's tour fills ./store; `serve --examples --store ./store` then shows the examples beside them."""
    from alloctrace.traces.sources import import_paths

    store = open_store(tmp_path)
    [own] = import_paths(store, [fixtures / "v2023-08-28-parseseq" / "gpt-2_tiny_short.AT.log"], name="my run")
    ids = seed_examples(store)
    assert len(ids) == 3 and own not in ids
    assert len(store.list()) == 4
    assert seed_examples(store) == [] and len(store.list()) == 4
