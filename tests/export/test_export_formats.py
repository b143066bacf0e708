"""The export formats are named once (traces/export/formats.py): the CLI, the API and docs/api.md offer exactly those."""
from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from alloctrace.cli import build_parser
from alloctrace.server.app import create_app
from alloctrace.traces.export import ggml, torch_formats
from alloctrace.traces.export.formats import FORMATS

ROOT = Path(__file__).resolve().parents[2]


def _subparser(parser, name):
    for action in parser._subparsers._group_actions:
        if name in action.choices:
            return action.choices[name]
    raise AssertionError(f"no {name} command")


def test_the_cli_offers_the_registry():
    export = _subparser(build_parser(["export", "x", "--format", "chrome"]), "export")
    fmt = next(a for a in export._actions if "--format" in a.option_strings)
    assert list(fmt.choices) == list(FORMATS)


def test_the_api_accepts_the_registry_and_nothing_else(tmp_path):
    with TestClient(create_app(store_dir=tmp_path / "store")) as c:
        schema = c.get("/openapi.json").json()
        params = schema["paths"]["/api/traces/{trace_id}/export"]["get"]["parameters"]
        pattern = next(p for p in params if p["name"] == "format")["schema"]["pattern"]
        assert sorted(re.fullmatch(r"\^\((.*)\)\$", pattern).group(1).split("|")) == sorted(FORMATS)
        for name, f in FORMATS.items():  # an unknown trace: 404, after the format was accepted
            assert c.get(f"/api/traces/0123abcd/export?format={name}").status_code == 404, name
        assert c.get("/api/traces/0123abcd/export?format=svg").status_code == 422


def test_the_docs_list_the_registry():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    listed = re.search(r"/export\?format=([a-z|\\]+)`", text).group(1).replace("\\", "").split("|")
    assert sorted(listed) == sorted(FORMATS)


def test_each_kind_exports_as_its_registry_entries():
    assert ggml.FORMATS == tuple(n for n, f in FORMATS.items() if "ggml" in f.kinds)
    assert torch_formats.FORMATS == tuple(n for n, f in FORMATS.items() if "torch" in f.kinds)
    assert {f.suffix.rsplit(".", 1)[-1] for f in FORMATS.values()} <= {"json", "jsonl", "csv"}
