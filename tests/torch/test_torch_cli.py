"""The CLI around PyTorch snapshots: diff (files or ids), export refusing, and the caching-allocator model hook."""
import json
from pathlib import Path

import pytest

from alloctrace.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def sidecar(name):
    return json.loads((DATA / f"{name}.json").read_text())


def test_diff_of_two_snapshot_files(capsys, tmp_path):
    a, b = DATA / "gpt2_train_bs8.pickle.gz", DATA / "gpt2_train_bs16.pickle.gz"
    rc, out, err = cli(capsys, "diff", a, b, "--json", "--store", tmp_path)
    assert rc == 1, err  # diff(1): they differ
    ids = [t["id"] for t in json.loads(cli(capsys, "list", "--json", "--store", tmp_path)[1])["traces"]]
    assert len(ids) == 2  # each file imported once
    d = json.loads(out)
    delta = (sidecar("gpt2_train_bs16")["memory_stats_subset"]["requested_bytes.all.peak"]
             - sidecar("gpt2_train_bs8")["memory_stats_subset"]["requested_bytes.all.peak"])
    assert d["delta_requested"] == delta == sum(r["delta"] for r in d["by_call_site"])
    rc, out, err = cli(capsys, "diff", a, b, "--store", tmp_path)
    assert rc == 1 and f"({delta:+,})" in out and "same call-site sequence" in out
    assert d["first_difference"]["differs_in"] == "size"  # same sequence, batch 16's tensors are larger
    assert d["first_difference"]["b"]["size"] > d["first_difference"]["a"]["size"]
    assert f"first allocation that differs (size): a #{d['first_difference']['a']['index']:,} " in out
    rc, out, err = cli(capsys, "diff", ids[0], f"{ids[0]}:0", "--store", tmp_path)
    assert rc == 0 and "(+0)" in out


def test_export_refuses_csv_of_a_snapshot_in_one_line(capsys, tmp_path):
    rc, out, err = cli(capsys, "import", DATA / "oom.pickle.gz", "--json", "--store", tmp_path)
    tid = json.loads(out)["traces"][0]["id"]
    rc, out, err = cli(capsys, "export", tid, "--format", "csv", "--store", tmp_path)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "PyTorch trace exports as chrome or jsonl" in err
    rc, out, err = cli(capsys, "show", tid, "--store", tmp_path)
    assert rc == 0 and "requested 50,331,648" in out


FIXTURES = sorted(p.name[:-len(".pickle.gz")] for p in DATA.glob("*.pickle.gz"))


@pytest.mark.parametrize("name", FIXTURES)
def test_every_fixture_imports_consistent(capsys, tmp_path, name):
    """`import --json` replays each real snapshot through the caching-allocator model: every device consistent,
    no first mismatch. Runs with OOMs are checked under the cap their OOMs imply, which must not exceed the
    cap the run really had (its sidecar's limit_bytes) and must explain as many OOMs as the run had."""
    rc, out, err = cli(capsys, "import", DATA / f"{name}.pickle.gz", "--json", "--store", tmp_path)
    assert rc == 0, err
    (trace,) = json.loads(out)["traces"]
    assert trace["devices"], trace
    for d in trace["devices"]:
        assert d["consistent"] is True, d
        assert "first_mismatch" not in d and "model_error" not in d
    from alloctrace.traces.store.store import open_store
    from alloctrace.traces.store.torch_stored import device_columns, device_info
    from alloctrace.traces.whatif.torch_request import infer_memory_limit
    s = open_store(tmp_path)
    cols, info = device_columns(s, trace["id"], 0), device_info(s, trace["id"], 0)
    assert info["consistent"] is True                      # stored with the row, not only printed
    truth = sidecar(name)
    limit = truth.get("limit_bytes", truth.get("scenario_details", {}).get("limit_bytes"))
    n_ooms = truth.get("num_ooms", truth.get("memory_stats_full", {}).get("num_ooms", 0))
    inferred = infer_memory_limit(cols)
    if n_ooms:
        assert inferred is not None and inferred <= limit
        assert info["oom"] is not None and info["oom"]["n_ooms"] == n_ooms
    else:
        assert inferred is None and info["oom"] is None


def test_the_caching_allocator_model_hook(capsys, tmp_path, monkeypatch):
    """What the model answers lands in `import --json`, and what it was given is the stored form."""
    from alloctrace.traces.whatif import torch_request as torch_whatif
    seen = {}

    def check_device(columns, info, **kw):  # progress=: the import's CPU cap
        seen.update(columns=columns, info=info)
        return {"consistent": False, "first_mismatch": {"event": 7, "model": 1, "trace": 2}}

    monkeypatch.setattr(torch_whatif, "check_device", check_device)
    monkeypatch.setenv("ALLOCTRACE_IMPORT_IN_PROCESS", "1")  # the patched model answers in this process
    rc, out, err = cli(capsys, "import", DATA / "oom.pickle.gz", "--json", "--store", tmp_path)
    assert rc == 0, err
    (d,) = json.loads(out)["traces"][0]["devices"]
    assert d["consistent"] is False and d["first_mismatch"] == {"event": 7, "model": 1, "trace": 2}
    from alloctrace.traces.store.store import open_store
    from alloctrace.traces.store.torch_stored import device_columns, device_info
    s = open_store(tmp_path)
    tid = json.loads(out)["traces"][0]["id"]
    stored = device_columns(s, tid, 0)
    assert set(seen["columns"]) == set(stored)
    assert all((seen["columns"][k] == stored[k]).all() for k in stored)
    assert seen["info"]["allocator_settings"] == device_info(s, tid, 0)["allocator_settings"]
    assert seen["info"]["strings"] == device_info(s, tid, 0)["strings"]
    assert device_info(s, tid, 0)["consistent"] is False

    def broken(columns, info, **kw):
        raise RuntimeError("model bug")

    monkeypatch.setattr(torch_whatif, "check_device", broken)
    # another tag: another import (the same file with the same tags is stored once)
    rc, out, err = cli(capsys, "import", DATA / "oom.pickle.gz", "--json", "--tag", "run=2", "--store", tmp_path)
    (d,) = json.loads(out)["traces"][0]["devices"]
    assert rc == 0 and d["consistent"] is None and "model bug" in d["model_error"]


def test_state_at_the_oom(capsys, tmp_path):
    rc, out, err = cli(capsys, "import", DATA / "oom.pickle.gz", "--json", "--store", tmp_path)
    tid = json.loads(out)["traces"][0]["id"]
    rc, out, err = cli(capsys, "state", tid, "--event", "oom", "--json", "--store", tmp_path)
    assert rc == 0, err
    st = json.loads(out)
    truth = sidecar("oom")["ground_truth"]
    assert st["next"]["action"] == "oom" and st["oom"]["event"] == st["event"]
    assert (st["totals"]["reserved"], st["totals"]["allocated"]) == (truth["memory_reserved"],
                                                                     truth["memory_allocated"])
    # the request could not fit: it is larger than every free block of the large pool
    assert st["oom"]["requested"] > st["totals"]["largest_free"]["large"]
    rc, out, err = cli(capsys, "state", tid, "--event", "oom", "--store", tmp_path)
    assert rc == 0 and "the cache was emptied: 11 segments" in out
    rc, out, err = cli(capsys, "state", f"{tid}:0", "--event", "start", "--json", "--store", tmp_path)
    assert json.loads(out)["segments"] == [] and json.loads(out)["after_entry"] is None
    rc, out, err = cli(capsys, "state", tid, "--event", "x", "--store", tmp_path)
    assert rc == 2 and err.startswith("alloctrace: error: --event")


def test_entry_numbers_mean_the_same_entry_in_every_view(capsys, tmp_path):
    """"At entry N" is entries 0..N applied in peak, flame, state, the OOM card, the API and the report: the peak
    entry peak prints is the one state --event peak says it follows, and state after that entry holds exactly
    the peak's requested bytes (one entry earlier it does not)."""
    rc, out, err = cli(capsys, "import", DATA / "oom.pickle.gz", "--json", "--store", tmp_path)
    tid = json.loads(out)["traces"][0]["id"]
    rc, out, err = cli(capsys, "peak", tid, "--json", "--store", tmp_path)
    p = json.loads(out)
    p = p["devices"][0] if "devices" in p else p
    k = p["event"]
    rc, out, err = cli(capsys, "state", tid, "--event", "peak", "--json", "--store", tmp_path)
    at_peak = json.loads(out)
    assert at_peak["after_entry"] == k and at_peak["totals"]["requested"] == p["peak_requested"]
    rc, out, err = cli(capsys, "state", tid, "--event", str(k), "--json", "--store", tmp_path)
    assert json.loads(out)["totals"] == at_peak["totals"]
    rc, out, err = cli(capsys, "state", tid, "--event", str(k - 1), "--json", "--store", tmp_path)
    assert json.loads(out)["totals"]["requested"] != p["peak_requested"]
    rc, out, err = cli(capsys, "state", tid, "--event", "peak", "--store", tmp_path)
    assert f"after entry {k:,} " in out
    rc, out, err = cli(capsys, "flame", tid, "--at", "peak", "-o", tmp_path / "f.svg", "--store", tmp_path)
    assert rc == 0 and f"live at entry {k:,}" in err
    rc, out, err = cli(capsys, "state", tid, "--event", "oom", "--store", tmp_path)
    oom = json.loads(cli(capsys, "state", tid, "--event", "oom", "--json", "--store", tmp_path)[1])["oom"]["event"]
    assert f"after entry {oom - 1:,}, just before the OOM at entry {oom:,}" in out
    n = json.loads(cli(capsys, "state", tid, "--json", "--store", tmp_path)[1])["n_events"]
    rc, out, err = cli(capsys, "state", tid, "--event", str(n), "--store", tmp_path)
    assert rc == 2 and f"0..{n - 1}" in err


def test_diff_refuses_a_snapshot_against_a_ggml_trace_in_one_line(capsys, tmp_path):
    from alloctrace.allocator.events import Event
    from alloctrace.traces.store.schema import GraphRecord, TraceMeta
    from alloctrace.traces.store.store import open_store

    s = open_store(tmp_path)
    ggml = s.add_trace(TraceMeta(name="ggml", source="test", generation="ggml-2023-08-16"),
                       [GraphRecord(0, "eval", [Event("graph")])])
    s.close()
    rc, out, err = cli(capsys, "import", DATA / "oom.pickle.gz", "--json", "--store", tmp_path)
    tid = json.loads(out)["traces"][0]["id"]
    for a, b in ((tid, ggml), (ggml, tid)):
        rc, out, err = cli(capsys, "diff", a, b, "--store", tmp_path)
        assert rc == 2 and out == "" and err.count("\n") == 1 and "same kind" in err, err
