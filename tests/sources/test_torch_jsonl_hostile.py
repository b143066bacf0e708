"""A damaged or hostile PyTorch JSON Lines file (tests/hostile_inputs.py: torch_jsonl_variants) is refused with one
line naming the file, its line and the problem (CLI: exit 2; upload: 422, or 413 past a budget) and leaves nothing
stored; the import's budgets (decompressed bytes, CPU time, graphs per file) hold for this format too."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.store.store import open_store
from hostile_inputs import refused_import, torch_jsonl_variants

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "torch" / "small_default.pickle.gz"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile-jsonl")
    store = str(root / "s")
    assert main(["import", str(SNAPSHOT), "--store", store]) == 0
    [t] = open_store(store).list()
    assert main(["export", t["id"], "--format", "jsonl", "-o", str(root / "good.jsonl"), "--store", store]) == 0
    return root / "good.jsonl"




def test_the_unharmed_file_imports(exported, tmp_path, capsys):
    assert main(["import", str(exported), "--store", str(tmp_path / "s")]) == 0
    assert len(open_store(tmp_path / "s").list()) == 1


def test_each_damage_is_one_line_naming_the_line(exported, tmp_path, capsys):
    variants = torch_jsonl_variants(exported.read_text())
    assert len(variants) >= 20
    for label, (text, said) in variants.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        err = refused_import(capsys, bad, tmp_path / label.replace(" ", "-"))
        assert said in err and "bad.jsonl" in err, (label, err)


def test_the_server_refuses_each_with_422(exported, tmp_path):
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        for label, (text, said) in torch_jsonl_variants(exported.read_text()).items():
            r = c.post("/api/traces", files={"file": ("bad.jsonl", text.encode())})
            assert r.status_code == 422 and said in r.json()["detail"], (label, r.status_code, r.text)
        assert c.get("/api/traces").json()["traces"] == []
        r = c.post("/api/traces", files={"file": ("good.jsonl", exported.read_bytes())})
        assert r.status_code == 201, r.text
        r = c.post("/api/torch/traces", files={"file": ("good.jsonl", exported.read_bytes())})  # the PyTorch upload
        assert r.status_code == 201 and r.json()["traces"][0]["devices"][0]["n_events"] > 1000, r.text


def test_a_compressed_file_past_the_decompressed_cap_is_refused(exported, tmp_path, capsys):
    big = tmp_path / "big.jsonl.gz"
    big.write_bytes(gzip.compress(exported.read_bytes()))
    err = refused_import(capsys, big, tmp_path / "s", "--max-bytes", "64K")
    assert "decompresses to more than 65,536 bytes" in err


def test_too_many_devices_for_the_graph_cap_are_refused(exported, tmp_path):
    """Twenty devices where the graph cap allows ten: refused while reading, before the eleventh is built."""
    lines = exported.read_text().splitlines()
    header, body = lines[0], lines[1:]
    text = [header]
    for d in range(20):
        for line in body:
            x = json.loads(line)
            x["device"] = d
            text.append(json.dumps(x))
    bad = tmp_path / "many.jsonl"
    bad.write_text("\n".join(text) + "\n")
    r = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(bad), "--store", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "ALLOCTRACE_MAX_GRAPHS": "10"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "more than 10 graphs" in r.stderr, r.stderr


def test_the_cpu_cap_covers_reading_and_the_model_check(exported, tmp_path):
    """A file of many devices under a CPU cap it cannot meet: one line, nothing stored."""
    lines = exported.read_text().splitlines()
    text = [lines[0]]
    for d in range(60):
        for line in lines[1:]:
            x = json.loads(line)
            x["device"] = d
            text.append(json.dumps(x))
    bad = tmp_path / "slow.jsonl"
    bad.write_text("\n".join(text) + "\n")
    r = subprocess.run([sys.executable, "-m", "alloctrace", "import", str(bad), "--store", str(tmp_path / "s"),
                        "--max-cpu", "0.1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "s of CPU time" in r.stderr, r.stderr
    assert open_store(tmp_path / "s").list() == []
