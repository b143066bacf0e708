"""GET /api/preflight and /api/preflight/{id} on a store a real `fit`, `sweep` and `plan --vary` filled
(tests/preflight_results.py): the curves the page draws, another budget, and bad ids and budgets as 4xx."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from alloctrace.server.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_sweep_program import kv_bytes  # noqa: E402
from preflight_results import FIT_BUDGET, build  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preflight")
    got = build(tmp / "store", tmp)
    with TestClient(create_app(store_dir=tmp / "store")) as c:
        c.got = got
        yield c


def test_the_list_names_every_result_by_kind(client):
    got = client.got
    listed = {r["id"]: r["kind"] for r in client.get("/api/preflight").json()["results"]}
    want = {got["fit"]["sweep"]: "fit", got["sweep"]["sweep"]: "sweep"}
    if got["plan"]:
        want[got["plan"]["plan"]] = "plan"
    assert listed == want


def test_a_fit_answers_with_every_probe_its_budget_and_laws(client):
    fit = client.got["fit"]
    r = client.get(f"/api/preflight/{fit['sweep']}").json()
    assert r["kind"] == "fit" and r["axis"] == "-c" and r["budget"] == FIT_BUDGET and r["range"] == [64, 512]
    assert r["answers"] == [{"setting": "", "value": 192, "bytes": fit["total"], "law_value": 192}]
    curves = {c["name"]: c for c in r["curves"]}
    kv = curves["CUDA0 KV cache"]
    assert [p["x"] for p in kv["points"]] == sorted(p["value"] for p in fit["probes"])
    assert all(abs(p["bytes"] - kv_bytes("CUDA0", p["x"], 2)) <= p["uncertainty_bytes"] == 5243 for p in kv["points"])
    assert kv["law"]["slope"] == 2048 and kv["law"]["holds"] == "within the printed rounding"
    assert curves["CPU compute buffer"]["law"] == {"intercept": 16384, "slope": 768, "formula": "16,384 + 768·-c B",
                                                   "exact": True, "holds": "exact"}
    assert all(p["x"] % 64 == 0 and 64 <= p["x"] <= 512 for p in curves["total"]["predicted"])


def test_another_budget_is_answered_from_the_runs(client):
    fit = client.got["fit"]
    r = client.get(f"/api/preflight/{fit['sweep']}", params={"budget": "48MiB"}).json()
    fitting = [p for p in fit["probes"] if p["total"] <= 48 << 20]
    assert r["budget"] == 48 << 20 and r["stored_budget"] == FIT_BUDGET
    assert r["answers"][0]["value"] == max(p["value"] for p in fitting)


def test_a_plan_search_is_curves_per_category(client):
    plan = client.got["plan"]
    if plan is None:
        pytest.skip("torch is not installed")
    r = client.get(f"/api/preflight/{plan['plan']}").json()
    assert r["kind"] == "plan" and r["axis"] == "batch" and r["answers"][0]["value"] == plan["value"]
    curves = {c["name"]: c for c in r["curves"]}
    assert [p["oom"] for p in curves["parameters"]["points"]] == [p["oom"] is not None for p in plan["points"]]
    assert curves["inputs"]["law"]["slope"] == plan["laws"]["inputs"]["b_per_unit"]
    assert r["traces"][0] == plan["trace"]          # the answer's run first, then every other point's
    assert sorted(r["traces"]) == sorted(p["trace"] for p in plan["points"] if p.get("trace"))


@pytest.mark.parametrize("path, status", [("/api/preflight/0000dead", 404), ("/api/preflight/not-hex", 422),
                                          ("/api/preflight/" + "a" * 33, 422)])
def test_bad_ids(client, path, status):
    r = client.get(path)
    assert r.status_code == status and r.json()["detail"]


def test_a_bad_budget_is_a_400(client):
    r = client.get(f"/api/preflight/{client.got['fit']['sweep']}", params={"budget": "lots"})
    assert r.status_code == 400 and "budget" in r.json()["detail"]
