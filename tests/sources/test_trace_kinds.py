"""One trace-kind dispatch (traces/store/kinds.py): the CLI and the server tell a ggml trace from a PyTorch
snapshot the same way and refuse the wrong kind with the same message."""
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace import cli
from alloctrace.allocator.events import Event
from alloctrace.server.app import create_app
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.kinds import GGML, TORCH, WrongKind, require_kind, trace_kind
from alloctrace.traces.store.schema import GraphRecord, TraceMeta
from alloctrace.traces.store.store import NotFound, open_store
from alloctrace.traces.store.torch_stored import device_columns

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "torch" / "oom.pickle.gz"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    s = open_store(d)
    ggml = s.add_trace(TraceMeta(name="ggml", source="ggml-log", generation="ggml-2023-08-16"),
                       [GraphRecord(0, "eval", [Event("graph")])])
    (torch,) = import_paths(s, [SNAPSHOT])
    s.close()
    return d, ggml, torch


def test_the_kind_of_a_stored_trace(stored):
    d, ggml, torch = stored
    s = open_store(d)
    assert trace_kind(s, ggml) == GGML and trace_kind(s, torch) == TORCH and trace_kind(s, f"{torch}:0") == TORCH
    assert require_kind(s, f"{torch}:0", TORCH) == (torch, 0)
    with pytest.raises(WrongKind, match=rf"trace {ggml} is not a PyTorch snapshot \(source 'ggml-log'\)"):
        require_kind(s, ggml, TORCH)
    with pytest.raises(WrongKind):
        device_columns(s, ggml, 0)  # the stored-torch readers ask the same question
    with pytest.raises(NotFound):
        trace_kind(s, "0000ffff")


def test_cli_and_server_refuse_the_wrong_kind_alike(stored, capsys):
    d, ggml, torch = stored
    rc = cli.main(["state", ggml, "--store", str(d)])
    err = capsys.readouterr().err
    assert rc == 2
    line = f"trace {ggml} is not a PyTorch snapshot (source 'ggml-log')"
    assert err.startswith("alloctrace: error: " + line) and "dashboard and the API" in err
    with TestClient(create_app(store_dir=d)) as c:
        for url in (f"/api/torch/traces/{ggml}", f"/api/torch/traces/{ggml}/devices/0/peak"):
            r = c.get(url)
            assert r.status_code == 400 and line in r.text, (url, r.status_code, r.text)
        assert c.get(f"/api/torch/traces/{torch}").status_code == 200
