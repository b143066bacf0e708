"""The OOM card's cause, cap, retries and largest blocks, checked against what the real runs' allocator said
(sidecars: the cap the script set, num_alloc_retries), in the views, the CLI and the API."""
import json
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.explain import torch_peak
from alloctrace.traces.state import torch_device as views
from alloctrace.traces.explain.torch_oom import _roundest, cause

DATA = Path(__file__).parents[1] / "data" / "torch"
# real runs under a cap (the cap the script set and num_alloc_retries are in their sidecars)
RUNS = ["oom", "small_cap_default", "small_cap_maxsplit", "small_cap_gc", "pairs/train_cap"]


def _truth(name):
    side = json.loads((DATA / f"{name}.json").read_text())
    if name == "oom":
        return side["scenario_details"]["limit_bytes"], side["memory_stats_full"]["num_alloc_retries"]
    return side["allowed_bytes"], side["num_alloc_retries"]


@pytest.fixture(scope="module")
def cards(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("store"))
    out = {}
    for name in RUNS:
        [tid] = import_paths(s, [DATA / f"{name}.pickle.gz"])
        d = views.load_device(s, tid, 0)
        out[name] = torch_peak.oom_card(d, views.StateIndex(d))
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_cap_range_holds_the_real_cap_and_retries_are_the_allocators(cards, name):
    card = cards[name]
    cap, retries = _truth(name)
    assert card["cause"]["kind"] == "cap"
    assert card["cap"]["lower"] <= cap < card["cap"]["upper"]
    assert card["retries"] == retries
    assert card["device_free"] > card["segment_needed"]          # the GPU had room: the cap refused
    assert card["largest_blocks"] and card["largest_blocks"] == sorted(card["largest_blocks"],
                                                                       key=lambda b: -b["bytes"])
    assert sum(g["bytes"] for g in card["holders"]) >= card["largest_blocks"][0]["bytes"]


def test_the_6gib_cap_is_the_roundest_value_in_its_range(cards):
    assert cards["oom"]["cap"]["roundest"] == 6 << 30
    assert "6,442,450,944 B (6 GiB)" in cards["oom"]["cause"]["text"]
    # the old inference (the largest reserved + segment that succeeded) is only the lower end
    assert cards["oom"]["cap"]["lower"] == 6_442_450_944 - 6_291_456


def test_roundest_and_a_full_gpu():
    assert _roundest(6_436_159_488, 6_459_228_160) == 6 << 30
    assert _roundest(1000, 2000) is None
    c = cause({"segment_needed": 20 << 20, "device_free": 3 << 20}, {"lower": 1, "upper": 2, "roundest": None})
    assert c["kind"] == "device" and "GPU itself was full" in c["text"]


def test_cli_state_and_peak_show_cause_retries_and_holders(tmp_path, capsys):
    assert main(["import", str(DATA / "oom.pickle.gz"), "--store", str(tmp_path), "--json"]) == 0
    tid = json.loads(capsys.readouterr().out)["traces"][0]["id"]
    assert main(["state", tid, "--event", "oom", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cause: a memory cap (set_per_process_memory_fraction)" in out
    assert "between 6,436,159,488 and" in out and "retries" in out and ": 2" in out
    assert "largest blocks held: 154,389,504 B" in out and "WHO HELD THE MEMORY" in out
    assert main(["peak", tid, "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "OOM at entry 10,312" in out and "cause: a memory cap" in out


def test_api_oom_card(tmp_path):
    from fastapi.testclient import TestClient
    from alloctrace.server.app import create_app
    s = open_store(tmp_path)
    [tid] = import_paths(s, [DATA / "oom.pickle.gz"])
    with TestClient(create_app(store_dir=tmp_path)) as c:
        card = c.get(f"/api/torch/traces/{tid}/devices/0/oom").json()["oom"]
    assert card["cap"]["lower"] <= 6_442_450_944 < card["cap"]["upper"] and card["retries"] == 2
    assert card["cause"]["kind"] == "cap" and len(card["largest_blocks"]) == 10
