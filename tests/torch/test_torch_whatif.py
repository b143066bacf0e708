"""Replay of real PyTorch snapshots through the caching-allocator model, and what-if runs.

Ground truth comes from the real runs: every recorded decision (compared entry by entry), the allocator's own
max_memory_reserved / max_memory_allocated / num_alloc_retries (sidecars), and the segments at snapshot time.
The small_* snapshots were recorded on an H200 (torch 2.11) with one workload under six settings
(bench/record_torch_snapshots.py)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from alloctrace.allocator.cuda_caching import (
    ALLOC, FREE_REQUESTED, OOM, SEGMENT_ALLOC, SEGMENT_FREE, AllocatorSettings)
from alloctrace.traces.whatif.torch_model import compare_settings, replay_check, trace_peaks, what_if
from alloctrace.traces.whatif.torch_request import apply_overrides, check_device, infer_memory_limit, parse_size

from torchsnap import DATA, columns, load, sidecar

BIG = ["gpt2_train_bs8", "gpt2_train_bs16", "oom", "fragmentation"]
SMALL = ["small_default", "small_expandable", "small_maxsplit", "small_roundup", "small_gc", "small_streams",
         "small_roundlist"]
CAPPED = ["small_cap_default", "small_cap_expandable", "small_cap_maxsplit", "small_cap_gc",
          "small_cap_expandable_streams", "small_cap_expandable_maxsplit", "small_cap_expandable_gc"]
MiB = 1 << 20


def _case(name):
    d = load(name)
    side = sidecar(name)
    if name.startswith("small_"):
        truth = {"reserved": side["max_memory_reserved"], "allocated": side["max_memory_allocated"],
                 "retries": side["num_alloc_retries"], "ooms": side["num_ooms"],
                 "limit": side.get("allowed_bytes") or side["limit_bytes"]}
    else:
        st = side["memory_stats_full"]
        truth = {"reserved": side["ground_truth"]["max_memory_reserved"],
                 "allocated": side["ground_truth"]["max_memory_allocated"],
                 "retries": st["num_alloc_retries"], "ooms": st["num_ooms"],
                 "limit": side["scenario_details"].get("limit_bytes")}
    return d, truth


def _snapshot_segments(d):
    return [{"address": s["address"], "total_size": s["total_size"],
             "blocks": [(b["address"], b["size"], b["state"] == "active_allocated") for b in s["blocks"]]}
            for s in sorted(d["segments"], key=lambda s: s["address"])]


def _model_segments(segs):
    return [{"address": s["address"], "total_size": s["total_size"],
             "blocks": [(b["address"], b["size"], b["allocated"]) for b in s["blocks"]]} for s in segs]


@pytest.mark.parametrize("name", BIG + SMALL + CAPPED)
def test_replay_consistent_with_every_recorded_decision(name):
    d, truth = _case(name)
    settings = AllocatorSettings.from_snapshot(d["allocator_settings"], memory_limit=truth["limit"])
    cols = columns(d["device_traces"][0])
    r = replay_check(cols, settings)
    assert r.consistent, r.mismatch
    assert r.events_checked == len(cols["action"])
    assert r.peak_reserved == truth["reserved"]            # the allocator's own max_memory_reserved()
    assert r.peak_allocated == truth["allocated"]          # max_memory_allocated(): rounded block sizes
    assert r.alloc_retries == truth["retries"]
    assert len(r.ooms) == truth["ooms"]
    assert _model_segments(r.segments) == _snapshot_segments(d)   # end state = the snapshot's segments/blocks


def test_oom_fixture_two_retries_then_the_recorded_oom():
    d, truth = _case("oom")
    cols = columns(d["device_traces"][0])
    r = replay_check(cols, AllocatorSettings.from_snapshot(d["allocator_settings"], memory_limit=truth["limit"]))
    k = int(np.flatnonzero(cols["action"] == OOM)[0])
    assert r.ooms == [{"event": k, "size": int(cols["size"][k])}]
    assert r.alloc_retries == 2 and r.cache_flushes == []  # the 11 segment frees are the allocator's own retry
    # without the cap the releases read as the program's empty_cache(), and the OOM cannot be explained:
    # the model gets a segment where the run failed
    r2 = replay_check(cols, AllocatorSettings.from_snapshot(d["allocator_settings"]))
    first_free = int(np.flatnonzero(cols["action"] == SEGMENT_FREE)[0])
    assert r2.cache_flushes == [first_free]
    assert not r2.consistent and r2.mismatch.event == k
    assert r2.mismatch.model["action"] == "segment_alloc" and r2.mismatch.expected["action"] == "oom"


def test_oom_fixture_cap_inferred_from_the_trace():
    d, truth = _case("oom")
    cols = columns(d["device_traces"][0])
    limit = infer_memory_limit(cols)
    assert limit <= truth["limit"]
    assert check_device(cols, {"allocator_settings": d["allocator_settings"]})["consistent"]
    assert infer_memory_limit(columns(load("gpt2_train_bs8")["device_traces"][0])) is None


@pytest.mark.parametrize("name", ["small_cap_default", "small_cap_expandable", "small_cap_maxsplit",
                                  "small_cap_expandable_streams"])
def test_capped_runs_consistent_with_the_inferred_cap(name):
    """The cap is not in a snapshot; the one inferred from the trace explains every release, retry and OOM
    (with expandable segments too, where reserved memory passed the real cap)."""
    d, truth = _case(name)
    cols = columns(d["device_traces"][0])
    assert infer_memory_limit(cols, AllocatorSettings.from_snapshot(d["allocator_settings"])) <= truth["limit"]
    out = check_device(cols, {"allocator_settings": d["allocator_settings"]})
    assert out["consistent"] and out["alloc_retries"] == truth["retries"]


def test_roundup_intervals_below_one_mib_use_the_first():
    """roundup_power2_divisions:[1:8,>:2]: requests below 1 MiB round with the first interval's 8 divisions
    (PyTorch 2.8+); rounding them with the last interval's 2, as older releases did, departs from the run."""
    import dataclasses
    d, _ = _case("small_roundlist")
    cols = columns(d["device_traces"][0])
    s = AllocatorSettings.from_snapshot(d["allocator_settings"])
    assert s.roundup_power2_divisions == (8,) + (2,) * 15
    assert replay_check(cols, s).consistent
    assert not replay_check(cols, dataclasses.replace(s, roundup_power2_divisions=(2,) * 16)).consistent


def test_fragmentation_fixture_flush_is_the_programs_empty_cache():
    d, truth = _case("fragmentation")
    cols = columns(d["device_traces"][0])
    r = replay_check(cols, AllocatorSettings.from_snapshot(d["allocator_settings"]))
    frees = np.flatnonzero(cols["action"] == SEGMENT_FREE)
    assert len(frees) == 171
    assert r.cache_flushes == [int(frees[0])]              # one release of every cached segment, after the 4 GiB
    assert r.alloc_retries == 0                             # ... which was freed first: not a retry


def test_a_moved_allocation_is_the_first_mismatch():
    d, _ = _case("gpt2_train_bs8")
    cols = columns(d["device_traces"][0])
    allocs = np.flatnonzero(cols["action"] == ALLOC)
    k = int(allocs[len(allocs) // 2])
    recorded = int(cols["addr"][k])
    cols["addr"][k] += 512
    frees = np.flatnonzero((cols["action"] == FREE_REQUESTED) & (cols["addr"] == recorded))
    j = int(frees[frees > k][0])                           # its own free (and completion) move with it
    cols["addr"][j:j + 2] += 512
    r = replay_check(cols, AllocatorSettings())
    assert not r.consistent and r.mismatch.event == k
    assert r.mismatch.model["addr"] == recorded and r.mismatch.expected["addr"] == recorded + 512


def test_segment_of_another_size_is_a_mismatch():
    d, _ = _case("small_default")
    cols = columns(d["device_traces"][0])
    k = int(np.flatnonzero(cols["action"] == SEGMENT_ALLOC)[3])
    cols["size"][k] += 2 * MiB
    r = replay_check(cols, AllocatorSettings())
    assert not r.consistent and r.mismatch.event == k and r.mismatch.model["size"] == cols["size"][k] - 2 * MiB


# -- what if ---------------------------------------------------------------------------------------------------

def _live_rounded_peak(cols) -> int:
    """Peak of Σ live request sizes rounded up to 512 B: no allocator can reserve less (independent of the model)."""
    a, addr, size = cols["action"], cols["addr"], cols["size"]
    live, cur, peak = {}, 0, 0
    for i in range(len(a)):
        if a[i] == ALLOC:
            s = -(-int(size[i]) // 512) * 512
            live[int(addr[i])] = s
            cur += s
            peak = max(peak, cur)
        elif a[i] == FREE_REQUESTED:
            cur -= live.pop(int(addr[i]))
    return peak


@pytest.mark.parametrize("name", BIG)
def test_cap_at_the_recorded_peak_changes_nothing(name):
    d, truth = _case(name)
    cols = columns(d["device_traces"][0])
    rec = AllocatorSettings.from_snapshot(d["allocator_settings"], memory_limit=truth["limit"])
    capped = apply_overrides(rec, {}, str(truth["reserved"]))
    out = compare_settings(cols, rec, capped)
    real_oom = trace_peaks(cols)["oom"]
    assert out["whatif"]["oom"] == real_oom                # none where the run had none; the oom run's own OOM
    assert out["whatif"]["peak_reserved"] == truth["reserved"]
    assert out["whatif"]["peak_allocated"] == truth["allocated"]


@pytest.mark.parametrize("name", ["gpt2_train_bs8", "fragmentation"])
def test_cap_below_the_live_bytes_must_fail(name):
    d, _ = _case(name)
    cols = columns(d["device_traces"][0])
    bound = _live_rounded_peak(cols)
    r = what_if(cols, AllocatorSettings(memory_limit=bound - 1))
    assert r.oom is not None and r.stopped_at == r.oom["event"]
    assert cols["action"][r.oom["event"]] == ALLOC
    assert r.peak_reserved <= bound - 1


def test_expandable_segments_shrink_the_fragmentation_fixture():
    d, truth = _case("fragmentation")
    cols = columns(d["device_traces"][0])
    r = what_if(cols, AllocatorSettings(expandable_segments=True))
    assert r.oom is None
    lower = _live_rounded_peak(cols)
    # phase 1 never frees, so each pool's segment is packed: it maps Σ live sizes rounded to its page
    # (large pool 20 MiB pages, small pool ≤ 1 MiB requests 2 MiB pages); the 4 GiB request adds at most 4 GiB.
    a, size = cols["action"], cols["size"]
    first_free = int(np.flatnonzero(a == FREE_REQUESTED)[0])
    req = [-(-int(s) // 512) * 512 for s in size[:first_free][a[:first_free] == ALLOC]]
    large = sum(s for s in req if s > MiB)
    small = sum(s for s in req if s <= MiB)
    upper = -(-large // (20 * MiB)) * 20 * MiB + -(-small // (2 * MiB)) * 2 * MiB + (4 << 30)
    assert lower <= r.peak_reserved <= upper < truth["reserved"]


@pytest.mark.parametrize("other", ["small_expandable", "small_maxsplit", "small_roundup", "small_gc",
                                   "small_roundlist"])
def test_whatif_from_the_default_run_predicts_the_real_runs(other):
    """Each small_* run had the same requests; the default run's what-if must give the other run's real peaks."""
    base = load("small_default")
    d, truth = _case(other)
    cols = columns(base["device_traces"][0])
    settings = AllocatorSettings.from_snapshot(d["allocator_settings"], memory_limit=truth["limit"])
    r = what_if(cols, settings)
    assert r.oom is None
    assert r.peak_reserved == truth["reserved"]
    assert r.peak_allocated == truth["allocated"]


@pytest.mark.parametrize("other", ["small_cap_expandable", "small_cap_maxsplit", "small_cap_gc"])
def test_whatif_predicts_the_first_oom_of_the_capped_runs(other):
    """Under the 2 GiB cap the runs diverge after their first OOM (the program drops tensors then), so the
    default run's what-if is checked up to there: the same request fails, none before it."""
    base = columns(load("small_cap_default")["device_traces"][0])
    d, truth = _case(other)
    cols = columns(d["device_traces"][0])
    settings = AllocatorSettings.from_snapshot(d["allocator_settings"], memory_limit=truth["limit"])
    r = what_if(base, settings)

    def ordinal(c, event):                              # requests (alloc or oom entries) before `event`
        a = c["action"][:event]
        return int(((a == ALLOC) | (a == OOM)).sum())
    k = int(np.flatnonzero(cols["action"] == OOM)[0])
    assert r.oom is not None
    assert ordinal(base, r.oom["event"]) == ordinal(cols, k) and r.oom["size"] == cols["size"][k]


def test_parse_size_and_overrides():
    assert parse_size("6GiB") == 6 << 30 and parse_size("512 MiB") == 512 << 20 and parse_size("1.5GB") == 1_500_000_000
    assert parse_size("6G") == parse_size("6g") == 6 << 30 and parse_size("512M") == 512 << 20  # as --max-memory
    s = apply_overrides(AllocatorSettings(), {"max_split_size_mb": "64", "expandable_segments": "true",
                                              "roundup_power2_divisions": "4"}, "6GiB")
    assert s.max_split_size == 64 * MiB and s.expandable_segments and s.roundup_power2_divisions == (4,) * 16
    assert s.memory_limit == 6 << 30
    # set_per_process_memory_fraction: the oom fixture's 0.0429... of 150,109,880,320 B is its 6 GiB limit
    side = sidecar("oom")["scenario_details"]
    f = apply_overrides(AllocatorSettings(device_total=side["device_total_memory"]), {},
                        f"fraction:{side['per_process_memory_fraction']!r}")
    assert f.memory_limit == side["limit_bytes"]
    assert apply_overrides(AllocatorSettings(device_total=1000), {}, "50%").memory_limit == 500
    assert apply_overrides(AllocatorSettings(), {"device_memory": "80GiB"}, "fraction:0.25").memory_limit == 20 << 30
    with pytest.raises(ValueError):
        apply_overrides(AllocatorSettings(), {}, "fraction:1.5")
    for bad in ({"max_split_size_mb": "1"}, {"nope": "1"}, {"expandable_segments": "maybe"}):
        with pytest.raises(ValueError):
            apply_overrides(AllocatorSettings(), bad)
    with pytest.raises(ValueError):
        parse_size("six gigs")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "alloctrace", "whatif", *args], capture_output=True, text=True)


def _stored(store) -> list[str]:
    p = subprocess.run([sys.executable, "-m", "alloctrace", "list", "--json", "--store", str(store)],
                       capture_output=True, text=True)
    if p.returncode == 2 and "no store at" in p.stderr:
        return []  # nothing was ever stored: the command refused before making the store
    return [t["id"] for t in json.loads(p.stdout)["traces"]]


def test_cli_json_on_a_snapshot_file(tmp_path):
    """A file is imported into the store first (as `diff` does), then replayed from there; the id works after."""
    p = _cli(str(DATA / "oom.pickle.gz"), "--cap", "6GiB", "--set", "expandable_segments=true", "--json",
             "--store", str(tmp_path))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert _stored(tmp_path) == [out["trace_id"]] and out["device"] == 0
    again = _cli(f"{out['trace_id']}:0", "--cap", "6GiB", "--set", "expandable_segments=true", "--json",
                 "--store", str(tmp_path))
    assert again.returncode == 0 and json.loads(again.stdout) == out
    assert set(out) >= {"settings", "real", "whatif"}
    for side in ("real", "whatif"):
        assert set(out[side]) >= {"peak_reserved", "peak_allocated", "fragmentation_at_peak", "oom"}
    truth = sidecar("oom")["ground_truth"]
    assert out["real"]["consistent"] is True
    assert out["real"]["peak_reserved"] == truth["max_memory_reserved"]
    assert out["real"]["oom"]["size"] == 48 * MiB
    assert out["settings"]["expandable_segments"] is True and out["settings"]["memory_limit"] == 6 << 30


@pytest.mark.parametrize("args,needle", [
    (["--set", "expandable_segments"], "KEY=VALUE"),
    (["--set", "bogus=1"], "unknown setting"),
    (["--cap", "lots"], "not a size"),
])
def test_cli_bad_input_one_line(args, needle, tmp_path):
    p = _cli(str(DATA / "small_default.pickle.gz"), *args, "--store", str(tmp_path))
    assert p.returncode == 2 and needle in p.stderr
    assert p.stderr.startswith("alloctrace: error:") and p.stderr.count("\n") == 1
    assert _stored(tmp_path) == []                         # checked before the file is imported


def test_cli_refuses_a_pickle_that_runs_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))
    f = tmp_path / "evil.pickle"
    f.write_bytes(pickle.dumps({"device_traces": [[Evil()]]}))
    p = _cli(str(f), "--store", str(tmp_path / "store"))
    assert p.returncode == 2 and "owned" not in p.stdout and "builtins.print: refused" in p.stderr
    assert _stored(tmp_path / "store") == []


def test_side_stream_run_has_deferred_frees_and_stays_consistent():
    d, truth = _case("small_streams")
    cols = columns(d["device_traces"][0])
    a, addr = cols["action"], cols["addr"]
    fr = np.flatnonzero(a == FREE_REQUESTED)
    deferred = [i for i in fr if not (i + 1 < len(a) and a[i + 1] == 2 and addr[i + 1] == addr[i])]
    assert len(deferred) == 20 and len(set(cols["stream"].tolist())) == 2     # 20 record_stream'd tensors
    assert replay_check(cols, AllocatorSettings.from_snapshot(d["allocator_settings"])).consistent


def test_check_device_takes_the_stored_column_layout():
    """The snapshot source stores more columns (time, stack and metadata ids, device_free) and -1 as the address
    of oom entries; check_device reads what it needs and answers for the importer."""
    d, _ = _case("oom")
    entries = d["device_traces"][0]
    cols = columns(entries)
    cols["addr"] = np.where(cols["action"] == OOM, -1, cols["addr"])
    n = len(entries)
    cols.update(time_us=np.array([e["time_us"] for e in entries], dtype=np.int64),
                stack=np.full(n, -1, dtype=np.int32), meta=np.full(n, -1, dtype=np.int32),
                device_free=np.array([e.get("device_free", -1) for e in entries], dtype=np.int64))
    out = check_device(cols, {"allocator_settings": d["allocator_settings"], "segments": d["segments"]})
    assert out == {"consistent": True, "first_mismatch": None, "cache_flushes": 0, "alloc_retries": 2,
                   "cache_flush_events": [], "memory_limit": 6_436_159_488}   # the inferred cap (lower end)
    cols["size"][int(np.flatnonzero(cols["action"] == SEGMENT_ALLOC)[5])] += 512
    bad = check_device(cols, {"allocator_settings": d["allocator_settings"]})
    assert bad["consistent"] is False and bad["first_mismatch"]["event"] == int(
        np.flatnonzero(cols["action"] == SEGMENT_ALLOC)[5])


@pytest.mark.parametrize("actions", [[SEGMENT_FREE], [ALLOC, SEGMENT_FREE, SEGMENT_FREE], [FREE_REQUESTED]])
def test_entries_the_model_cannot_account_for_end_the_replay(actions):
    """The import replays every uploaded trace: an entry the model makes no decision for (a release of a segment
    it never had, a free of nothing) is the first mismatch, never a replay that stops advancing."""
    n = len(actions)
    cols = {"action": np.array(actions, dtype=np.int8), "addr": np.full(n, 1 << 30, dtype=np.int64),
            "size": np.full(n, 2 << 20, dtype=np.int64), "stream": np.zeros(n, dtype=np.int64)}
    out = check_device(cols, {})
    assert out["consistent"] is False and 0 <= out["first_mismatch"]["event"] < n


def test_a_gc_threshold_without_a_memory_cap_is_said_to_change_nothing(tmp_path):
    """The threshold acts only against a cap: without one the answer says so instead of showing a run that
    looks like a result; with a cap there is no such note."""
    bare = _cli(str(DATA / "small_default.pickle.gz"), "--set", "garbage_collection_threshold=0.5",
                "--store", str(tmp_path))
    assert bare.returncode == 0, bare.stderr
    assert "note: garbage_collection_threshold acts only under a memory cap" in bare.stdout
    js = _cli(str(DATA / "small_default.pickle.gz"), "--set", "garbage_collection_threshold=0.5", "--json",
              "--store", str(tmp_path))
    assert "changes nothing" in json.loads(js.stdout)["notes"][0]
    capped = _cli(str(DATA / "small_default.pickle.gz"), "--set", "garbage_collection_threshold=0.5", "--cap",
                  "6GiB", "--json", "--store", str(tmp_path))
    assert "notes" not in json.loads(capped.stdout)


def test_a_per_size_roundup_list_is_refused_with_the_syntax_that_works():
    base = AllocatorSettings()
    for value in ("[256:1,512:2,>:4]", "[1:8,>:2]"):
        with pytest.raises(ValueError, match=r"per-size form .*\[256:1,512:2,>:4\].*one value .*\(4\) or 16 values"):
            apply_overrides(base, {"roundup_power2_divisions": value})
    with pytest.raises(ValueError, match="give one value"):
        apply_overrides(base, {"roundup_power2_divisions": "four"})
    assert apply_overrides(base, {"roundup_power2_divisions": "[4]"}).roundup_power2_divisions == (4,) * 16
