"""Tags `key=value`: checked once, given by --tag to import, record and sweep (and to uploads), filtered by
`list -q` / `--tag` and the API; a preset sweep with tags stores its points for compare and history."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.cli import main
from alloctrace.server.app import create_app
from alloctrace.traces.errors import UserError
from alloctrace.traces.store.tags import as_dict, parse_tag, parse_tags, split_query, with_tags

LOG = Path(__file__).resolve().parents[1] / "data" / "explain" / "llama-tiny_c512_ub8.head.AT.log.gz"


def test_tag_rules():
    assert parse_tag(" commit = abc123 ") == "commit=abc123"
    assert parse_tags(["a=1", "b=2", "a=3"]) == ["a=3", "b=2"]  # a key given twice keeps its last value
    for bad in ("novalue", "=x", "k=", "1k=v", "k=\x1b[31m", "k=" + "v" * 201):
        with pytest.raises(UserError):
            parse_tag(bad)
    assert with_tags(["recording", "commit=old"], ["commit=new", "model=m"]) == ["recording", "commit=new", "model=m"]
    assert as_dict(["recording", "commit=a", "x=y=z"]) == {"commit": "a", "x": "y=z"}
    assert split_query("commit=a model=b", []) == (None, ["commit=a", "model=b"])
    assert split_query("llama run", ["a=b"]) == ("llama run", ["a=b"])


def test_list_filters_by_tag_and_shows_them(tmp_path, capsys):
    s = str(tmp_path / "s")
    for commit in ("a1", "b2"):
        assert main(["import", str(LOG), "--store", s, "--name", f"run {commit}", "--tag", f"commit={commit}"]) == 0
    capsys.readouterr()
    assert main(["list", "--store", s, "-q", "commit=b2"]) == 0
    out = capsys.readouterr().out
    assert "run b2" in out and "run a1" not in out and out.splitlines()[0].rstrip().endswith("TAGS")
    assert main(["list", "--store", s, "--tag", "commit=a1", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["traces"]] == ["run a1"]
    assert main(["list", "--store", s, "-q", "run"]) == 0
    assert capsys.readouterr().out.count("run ") == 2
    assert main(["import", str(LOG), "--store", s, "--tag", "bad"]) == 2
    assert "bad tag" in capsys.readouterr().err


def test_record_refuses_tags_with_a_raw_recording(capsys):
    assert main(["record", "-o", "x.atrec", "--tag", "commit=a", "--", "true"]) == 2
    assert "with -o nothing is stored" in capsys.readouterr().err


def test_a_preset_sweep_with_tags_stores_its_points(tmp_path, capsys):
    s = str(tmp_path / "s")
    assert main(["sweep", "--preset", "gpt2-117m", "--profile", "ggml-2023-08-28", "--n-batch", "8,64", "--tag",
                 "commit=x", "--store", s, "--json"]) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert main(["list", "--store", s, "--tag", "commit=x", "--json"]) == 0
    listed = {t["id"]: t for t in json.loads(capsys.readouterr().out)["traces"]}
    assert sorted(listed) == sorted(p["trace_id"] for p in points)
    for p in points:
        t = listed[p["trace_id"]]
        assert f"config=ggml-2023-08-28/c{p['n_ctx']}/b{p['n_batch']}" in t["tags"]
        assert t["graphs"][0]["max_size"] == p["max_size"]  # the stored measure graph is the point's


def test_uploads_take_tag_fields_and_the_api_filters(tmp_path):
    with TestClient(create_app(tmp_path / "s")) as c:
        with open(LOG, "rb") as f:
            r = c.post("/api/traces", files={"file": (LOG.name, f)}, data={"tag": ["commit=a", "model=m"]})
        assert r.status_code == 201 and r.json()["traces"][0]["tags"] == ["commit=a", "model=m"]
        with open(LOG, "rb") as f:
            bad = c.post("/api/traces", files={"file": (LOG.name, f)}, data={"tag": "nokey"})
        assert bad.status_code == 400 and "bad tag" in bad.json()["detail"]
        with open(LOG, "rb") as f:
            many = c.post("/api/traces", files={"file": (LOG.name, f)}, data={"tag": [f"k{i}=v" for i in range(65)]})
        assert many.status_code == 400
        assert len(c.get("/api/traces").json()["traces"]) == 1  # nothing of the refused uploads was stored
        assert len(c.get("/api/traces", params={"tag": ["commit=a", "model=m"]}).json()["traces"]) == 1
        assert c.get("/api/traces", params={"tag": "commit=b"}).json()["traces"] == []
        assert c.get("/api/tags").json() == {"tags": {"commit": {"a": 1}, "model": {"m": 1}}}
