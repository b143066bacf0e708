"""Traces that start mid-run (the ring buffer wrapped). A full real trace cut at entry K is the wrapped trace
of the same run: its states, peaks and what-if answers must be the full trace's from K on. Also a real wrapped
recording (max_entries=4000, tests/data/torch/pairs/train_wrapped) checked against the same workload recorded
whole in another process (train_default) and against the allocator's own counters."""
import gzip
import json
import pickle
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.explain import torch_peak
from alloctrace.traces.state import torch_device as views
from alloctrace.traces.store.torch_stored import device_columns, device_info
from alloctrace.traces.whatif.torch_request import PartialTrace, whatif_request
from alloctrace.traces.whatif.torch_model import replay_check
from alloctrace.allocator.cuda_caching import AllocatorSettings

DATA = Path(__file__).parents[1] / "data" / "torch"
PAIRS = DATA / "pairs"


def _snap(path):
    with gzip.open(path) as f:
        return pickle.load(f)


def _cut(snap, k, path):
    """The snapshot as a ring buffer that kept entries k.. would have written it (same segments at the end)."""
    cut = dict(snap, device_traces=[snap["device_traces"][0][k:]])
    path.write_bytes(pickle.dumps(cut, protocol=4))
    return path


def _layout(st):
    return ([(g["address"], g["size"], [(b["offset"], b["size"], b["state"], b["requested"]) for b in g["blocks"]])
             for g in st["segments"]], st["totals"])


@pytest.fixture(scope="module")
def cuts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wrapped")
    s = open_store(tmp / "store")
    out = {}
    for name, path in (("gpt2_train_bs8", DATA / "gpt2_train_bs8.pickle.gz"),
                       ("oom", DATA / "oom.pickle.gz"), ("fragmentation", DATA / "fragmentation.pickle.gz"),
                       ("train_roundup", PAIRS / "train_roundup.pickle.gz"),
                       ("train_expandable", PAIRS / "train_expandable.pickle.gz"),
                       ("small_expandable", DATA / "small_expandable.pickle.gz")):
        snap = _snap(path)
        n = len(snap["device_traces"][0])
        [full] = import_paths(s, [path])
        for k in (n // 3, (2 * n) // 3):
            [cut] = import_paths(s, [_cut(snap, k, tmp / f"{name}_{k}.pickle")])
            out[(name, k)] = (views.load_device(s, full, 0), views.load_device(s, cut, 0), full, cut)
    out["store"] = s
    return out


def _cases(cuts):
    return [(key, v) for key, v in cuts.items() if key != "store"]


def test_cut_traces_are_detected_and_seeded_exactly(cuts):
    for (name, k), (full, cut, *_) in _cases(cuts):
        p = cut.extra["partial"]
        assert p["partial"] and p["exact"], (name, k, p.get("reason"))
        assert p["orphan_frees"] > 0 or p["segments_older_than_trace"] > 0
        assert not full.extra["partial"]["partial"]
        assert cut.extra["trace_complete"] is False
        assert cut.extra["trace_matches_snapshot"] == full.extra["trace_matches_snapshot"]   # (roundup: both not)


def test_states_of_the_cut_are_the_full_traces_from_k_on(cuts):
    for (name, k), (full, cut, *_) in _cases(cuts):
        if not full.extra["trace_matches_snapshot"]:
            continue            # roundup_power2_divisions: the state view rounds to 512 B, for the whole trace too
        fi, ci = views.StateIndex(full), views.StateIndex(cut)
        for j in sorted({0, 1, 17, cut.n // 2, cut.n - 1, cut.n}):
            assert _layout(views.state(cut, ci, j)) == _layout(views.state(full, fi, k + j)), (name, k, j)
        assert "partial trace" in views.state(cut, ci, cut.n)["partial"]


def test_peaks_of_the_cut_are_the_full_traces_over_the_kept_part(cuts):
    for (name, k), (full, cut, *_) in _cases(cuts):
        freq, fres = full.curves()
        p = torch_peak.peak(cut, top=1000)
        assert p["peak_requested"] == int(freq[k:].max())
        assert p["peak_reserved"] == int(fres[k:].max())
        assert sum(g["bytes"] for g in p["by_call_site"]) == p["peak_requested"]
        assert "exact from entry 0" in p["partial"]


def test_whatif_of_the_cut_replays_the_recorded_part_exactly(cuts):
    s = cuts["store"]
    for (name, k), (full, cut, full_id, cut_id) in _cases(cuts):
        if "expandable" in name:   # states and peaks are exact, the model cannot start mid-run: refused, saying why
            with pytest.raises(PartialTrace, match="expandable segments"):
                whatif_request(device_columns(s, cut_id, 0), device_info(s, cut_id, 0), [])
            continue
        fcols = device_columns(s, full_id, 0)
        settings = AllocatorSettings.from_snapshot(full.extra["allocator_settings"],
                                                   memory_limit=6_442_450_944 if name == "oom" else None)
        whole = replay_check(fcols, settings, keep_series=True)
        out = whatif_request(device_columns(s, cut_id, 0), device_info(s, cut_id, 0), [],
                             recorded_cap="6442450944" if name == "oom" else None)
        assert out["real"]["consistent"], (name, k, out["real"]["mismatch"])
        assert out["real"]["peak_reserved"] == int(whole.reserved[k:].max())
        assert out["real"]["peak_allocated"] == int(whole.allocated[k:].max())
        # unchanged settings: the what-if run is the recorded run
        assert out["whatif"]["peak_reserved"] == out["real"]["peak_reserved"]
        assert out["whatif"]["peak_allocated"] == out["real"]["peak_allocated"]
        assert out["partial"]["exact_from"] == 0 and out["partial"]["seed_reserved"] > 0


def test_real_wrapped_recording(tmp_path):
    side = json.loads((PAIRS / "train_wrapped.json").read_text())
    s = open_store(tmp_path)
    [w] = import_paths(s, [PAIRS / "train_wrapped.pickle.gz"])
    [d] = import_paths(s, [PAIRS / "train_default.pickle.gz"])
    wd, dd = views.load_device(s, w, 0), views.load_device(s, d, 0)
    assert wd.n == side["record"]["max_entries"] == 4000
    p = wd.extra["partial"]
    assert p["exact"] and p["orphan_frees"] > 0 and p["segments_older_than_trace"] > 0
    # the same workload recorded whole: its state where the wrapped one starts has the same totals
    k = dd.n - wd.n
    seed = views.state(wd, views.StateIndex(wd), 0)["totals"]
    whole = views.state(dd, views.StateIndex(dd), k)["totals"]
    assert {x: seed[x] for x in ("reserved", "allocated", "requested", "segments")} == \
           {x: whole[x] for x in ("reserved", "allocated", "requested", "segments")}
    end = views.state(wd, views.StateIndex(wd), wd.n)["totals"]
    assert end["reserved"] == side["memory_reserved"] and end["allocated"] == side["memory_allocated"]
    out = whatif_request(device_columns(s, w, 0), device_info(s, w, 0), [])
    assert out["real"]["consistent"]
    assert out["real"]["peak_reserved"] == side["max_memory_reserved"]       # the allocator's own counters
    assert out["real"]["peak_allocated"] == side["max_memory_allocated"]
    assert torch_peak.peak(wd)["peak_requested"] == side["requested_peak"]


def _unrecoverable(tmp_path):
    """A cut of a capped run with expandable segments whose pages were unmapped: the state view cannot replay it
    to its snapshot even whole, so its start cannot be recovered."""
    snap = _snap(DATA / "small_cap_expandable.pickle.gz")
    return _cut(snap, len(snap["device_traces"][0]) // 3, tmp_path / "exp.pickle")


def test_a_start_that_cannot_be_recovered_refuses_whatif(tmp_path, capsys):
    path = _unrecoverable(tmp_path)
    assert main(["whatif", str(path), "--store", str(tmp_path / "s"), "--set", "max_split_size_mb=128"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("alloctrace: error: ") and "starts mid-run" in err
    s = open_store(tmp_path / "s")
    [tid] = [t["id"] for t in s.list()]
    info = device_info(s, tid, 0)
    with pytest.raises(PartialTrace):
        whatif_request(device_columns(s, tid, 0), info, [])
    assert main(["state", tid, "--event", "end", "--store", str(tmp_path / "s")]) == 0
    assert "cannot be recovered exactly" in capsys.readouterr().out


def test_an_unknown_start_is_never_shown_as_zeros(tmp_path, capsys):
    """The state replayed from nothing reads reserved 0: every face says unknown instead, and lists what the
    trace itself holds (the bytes of its own live allocations, a fact)."""
    s = open_store(tmp_path / "s")
    [tid] = import_paths(s, [_unrecoverable(tmp_path)])
    d = views.load_device(s, tid, 0)
    assert d.extra["partial"]["partial"] and not d.extra["partial"]["exact"]
    index = views.StateIndex(d)
    k = d.n // 2
    st = views.state(d, index, k)
    assert st["totals"] is None and st["segments"] == [] and "unknown" in st["unknown"]
    live = views.live_at(d, k - 1)
    assert st["held_since_start"] == {"allocations": len(live), "bytes": int(d.allocations().size[live].sum())}
    assert st["held_since_start"]["bytes"] > 0
    assert main(["state", tid, "--event", str(k - 1), "--store", str(tmp_path / "s")]) == 0  # after entry k-1
    out = capsys.readouterr().out
    assert "reserved, allocated and free blocks: unknown" in out and "reserved 0 " not in out
    assert f"{st['held_since_start']['bytes']:,} B" in out
    assert main(["state", tid, "--event", str(k - 1), "--json", "--store", str(tmp_path / "s")]) == 0
    assert json.loads(capsys.readouterr().out)["totals"] is None
    card = torch_peak.oom_card(d, index)     # the run's 5th OOM lies in the kept part
    assert card is not None and card["reserved"] is None


def test_expandable_wrapped_start_is_recovered(tmp_path):
    """The real expandable-segments recording cut at several entries: seeded exactly (its maps walked back), and
    its state at every 500th entry is the whole trace's."""
    snap = _snap(PAIRS / "train_expandable.pickle.gz")
    s = open_store(tmp_path / "s")
    [full] = import_paths(s, [PAIRS / "train_expandable.pickle.gz"])
    f = views.load_device(s, full, 0)
    fi = views.StateIndex(f)
    n = len(snap["device_traces"][0])
    for k in (n // 5, n // 2):
        [cut] = import_paths(s, [_cut(snap, k, tmp_path / f"e{k}.pickle")])
        c = views.load_device(s, cut, 0)
        assert c.extra["partial"]["exact"], c.extra["partial"]["reason"]
        assert "whatif_refused" in c.extra["partial"]
        ci = views.StateIndex(c)
        for j in range(0, c.n + 1, 500):
            assert _layout(views.state(c, ci, j)) == _layout(views.state(f, fi, k + j)), (k, j)


def test_cli_says_partial_everywhere(tmp_path, capsys):
    path = PAIRS / "train_wrapped.pickle.gz"
    assert main(["import", str(path), "--store", str(tmp_path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    tid = rep["traces"][0]["id"]
    assert rep["traces"][0]["devices"][0]["partial"]["exact_from"] == 0
    for cmd in (["peak", tid], ["state", tid, "--event", "end"], ["whatif", tid]):
        assert main(cmd + ["--store", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "note: " in out and ("partial trace" in out or "starts mid-run" in out), cmd


def test_diff_says_which_side_is_partial(tmp_path, capsys):
    main(["diff", str(PAIRS / "train_default.pickle.gz"), str(PAIRS / "train_wrapped.pickle.gz"),
          "--store", str(tmp_path)])
    out = capsys.readouterr().out
    assert "note (b): partial trace" in out and "note (a)" not in out


def test_real_wrapped_recording_with_an_oom_under_a_cap(tmp_path):
    """train_cap_wrapped: the capped run with max_entries=3000, its OOM inside the kept part."""
    side = json.loads((PAIRS / "train_cap_wrapped.json").read_text())
    s = open_store(tmp_path)
    [tid] = import_paths(s, [PAIRS / "train_cap_wrapped.pickle.gz"])
    d = views.load_device(s, tid, 0)
    assert d.n == 3000 and d.extra["partial"]["exact"]
    out = whatif_request(device_columns(s, tid, 0), device_info(s, tid, 0), [],
                         recorded_cap=str(side["allowed_bytes"]))
    assert out["real"]["consistent"] and out["real"]["peak_reserved"] == side["max_memory_reserved"]
    assert out["whatif"]["oom"] == out["real"]["oom"] and out["real"]["oom"]["size"] == 160 << 20
    card = torch_peak.oom_card(d, views.StateIndex(d))
    assert card["cap"]["lower"] <= side["allowed_bytes"] < card["cap"]["upper"]
    assert card["retries"] == side["num_alloc_retries"] and "partial trace" in card["partial"]


def test_api_refuses_whatif_on_an_unrecoverable_start_and_marks_partial_answers(tmp_path):
    from fastapi.testclient import TestClient
    from alloctrace.server.app import create_app
    s = open_store(tmp_path / "s")
    [bad] = import_paths(s, [_unrecoverable(tmp_path)])
    [good] = import_paths(s, [PAIRS / "train_wrapped.pickle.gz"])
    with TestClient(create_app(store_dir=tmp_path / "s")) as c:
        r = c.get(f"/api/torch/traces/{bad}/devices/0/whatif")
        assert r.status_code == 400 and "starts mid-run" in r.text and "\n" not in r.json()["detail"]
        assert c.get(f"/api/torch/traces/{good}/devices/0/whatif").json()["partial"]["exact_from"] == 0
        summary = c.get(f"/api/torch/traces/{good}").json()["devices"][0]["partial"]
        assert summary["exact"] and "seed" not in summary and "exact from entry 0" in summary["note"]
        for view in ("peak", "state?event=0", "timeline"):
            assert "partial trace" in c.get(f"/api/torch/traces/{good}/devices/0/{view}").json()["partial"], view
