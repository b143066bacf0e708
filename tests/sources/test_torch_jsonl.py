"""A PyTorch trace exported as JSON Lines and imported back (traces/export/torch_jsonl.py ->
traces/sources/torch/jsonl.py) is the same trace: the same id, the same stored rows byte for byte (checksums),
and every view answers the same (show, state at several entries, the OOM card, peak by call site, flamegraphs,
a what-if, the Chrome export, the HTML report, categories), for real snapshots of every kind: plain, expandable segments,
several streams, an OOM, a wrapped ring buffer, a recorded program, a recorded DDP job (a device per rank) and
`alloctrace plan --vary` runs. Importing the same file twice stores it once."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from alloctrace.cli import main
from alloctrace.traces.store.store import open_store
from alloctrace.traces.store.torch_stored import categories

DATA = Path(__file__).resolve().parents[1] / "data" / "torch"
SNAPSHOTS = {"plain": DATA / "gpt2_train_bs8.pickle.gz", "expandable": DATA / "small_cap_expandable_streams.pickle.gz",
             "oom": DATA / "oom.pickle.gz", "wrapped": DATA / "pairs" / "train_wrapped.pickle.gz",
             "recorded": DATA / "recorded" / "oom" / "pid500.pickle.gz", "ranks": DATA / "recorded" / "ddp"}
GRAPH_ROW = "trace_id, idx, role, n_events, max_size, buffer_size, oom, consistent, extra, strings, packed, checksum"
TRACE_ROW = "id, name, source, generation, profile, created, tags, extra"
PLAN_PROGRAM = """import sys
import torch
batch = int(sys.argv[1])
m = torch.nn.Sequential(torch.nn.Linear(256, 512, device="cuda"), torch.nn.ReLU(), torch.nn.Linear(512, 10, device="cuda"))
opt = torch.optim.AdamW(m.parameters())
x = torch.randn(batch, 256, device="cuda")
for _ in range(2):
    m(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A store holding every kind of PyTorch trace: its path and {label: trace id}."""
    root = tmp_path_factory.mktemp("torch-jsonl")
    store = str(root / "a")
    ids = {}
    for label, path in SNAPSHOTS.items():
        argv = ["import", str(path), "--store", store, "--json"] + (["--tag", "run=one"] if label == "plain" else [])
        r = subprocess.run([sys.executable, "-m", "alloctrace", *argv], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        ids[label] = json.loads(r.stdout)["traces"][0]["id"]
    return root, store, ids


@pytest.fixture(scope="module")
def planned(original):
    """The same store with `alloctrace plan --vary` runs of a small training step (tags, a search in `extra`)."""
    pytest.importorskip("torch")
    root, store, ids = original
    (root / "mlp.py").write_text(PLAN_PROGRAM)
    r = subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--json", "--store", store, "--vary", "batch=8..64",
                        "--budget", "1GiB", "--", sys.executable, str(root / "mlp.py"), "{batch}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ids["plan"] = json.loads(r.stdout)["trace"]
    return root, store, ids


def stored_rows(store: str, tid: str) -> tuple:
    with sqlite3.connect(Path(store) / "alloctrace.db") as db:
        return (db.execute(f"SELECT {TRACE_ROW} FROM traces WHERE id=?", (tid,)).fetchall(),
                db.execute(f"SELECT {GRAPH_ROW} FROM graphs WHERE trace_id=? ORDER BY idx", (tid,)).fetchall())


def views(capsys, store: str, tid: str, out: Path) -> dict:
    """What every face shows of a trace (text and JSON as printed, files as bytes)."""
    s = open_store(store)
    summary = s.summary(tid)
    got = {"show": run(capsys, "show", tid, "--json", "--store", store),
           "peak": run(capsys, "peak", tid, "--json", "--store", store),
           "categories": categories(s, tid), "tags": s.meta(tid).tags}
    for g in summary["graphs"]:
        ref = f"{tid}:{g['index']}"
        n = g["n_events"]
        for at in ["start", "0", str(n // 3), str(2 * n // 3), "peak", "end"] + (["oom"] if g["oom"] else []):
            got[f"state {ref} {at}"] = run(capsys, "state", ref, "--event", at, "--json", "--store", store)
        for at in ["peak", "end"] + (["oom"] if g["oom"] else []):
            got[f"flame {ref} {at}"] = run(capsys, "flame", ref, "--at", at, "--store", store)
        rc = main(["whatif", ref, "--set", "max_split_size_mb=64", "--json", "--store", store])  # refused for some
        got[f"whatif {ref}"] = (rc, *capsys.readouterr())
    for fmt in ("chrome", "jsonl"):
        run(capsys, "export", tid, "--format", fmt, "-o", str(out / f"{tid}.{fmt}"), "--store", store)
        got[fmt] = (out / f"{tid}.{fmt}").read_bytes()
    run(capsys, "report", tid, "-o", str(out / f"{tid}.html"), "--store", store)
    got["report"] = (out / f"{tid}.html").read_bytes()
    return got


@pytest.mark.parametrize("label", list(SNAPSHOTS) + ["plan"])
def test_an_exported_trace_imports_back_with_every_view_equal(original, label, tmp_path, capsys, request):
    root, store, ids = request.getfixturevalue("planned") if label == "plan" else original
    tid = ids[label]
    exported = tmp_path / f"{label}.jsonl"
    run(capsys, "export", tid, "--format", "jsonl", "-o", str(exported), "--store", store)
    header = json.loads(exported.read_text().split("\n", 1)[0])
    assert (header["format"], header["version"], header["id"]) == ("alloctrace-torch-jsonl", 2, tid)
    again = str(tmp_path / "b")
    [back] = json.loads(run(capsys, "import", str(exported), "--store", again, "--json"))["traces"]
    assert back["id"] == tid and back["source"] == "torch"
    assert stored_rows(again, tid) == stored_rows(store, tid)  # every byte, every checksum, every fact
    (tmp_path / "views-a").mkdir()
    (tmp_path / "views-b").mkdir()
    before, after = views(capsys, store, tid, tmp_path / "views-a"), views(capsys, again, tid, tmp_path / "views-b")
    assert before.keys() == after.keys()
    for k in before:
        assert before[k] == after[k], k
    assert after["jsonl"] == exported.read_bytes()  # exporting the import gives the same file


def test_the_round_trip_covers_what_the_fixtures_hold(planned, tmp_path, capsys):
    """The fixtures above hold what the format must carry: OOMs, expandable segments, several streams,
    annotations and user metadata, a wrapped trace, ranks, tags and a plan's categories."""
    root, store, ids = planned
    s = open_store(store)
    extra = {k: s.graph_extras(t) for k, t in ids.items()}
    assert s.summary(ids["oom"])["graphs"][0]["oom"] and s.summary(ids["recorded"])["graphs"][0]["oom"]
    assert extra["wrapped"][0]["partial"]["partial"] and not extra["plain"][0]["partial"]["partial"]
    assert [e["rank"] for e in extra["ranks"].values()] == [0, 1]
    assert categories(s, ids["plan"])["known"] and "plan=" in " ".join(s.meta(ids["plan"]).tags)
    run(capsys, "export", ids["plain"], "--format", "jsonl", "-o", str(tmp_path / "x.jsonl"), "--store", store)
    types = {}
    for line in (tmp_path / "x.jsonl").read_text().splitlines():
        d = json.loads(line)
        types[d["type"]] = types.get(d["type"], 0) + 1
        if d["type"] == "entry" and "user_metadata" in d:
            types["with metadata"] = types.get("with metadata", 0) + 1
    assert {"strings", "frame", "stack", "entry", "segment", "block", "annotation", "with metadata"} <= types.keys()
    assert types["entry"] == 10_249 and types["segment"] == 190 and types["block"] == 629  # the README's counts
    run(capsys, "export", ids["expandable"], "--format", "jsonl", "-o", str(tmp_path / "e.jsonl"), "--store", store)
    segs = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines() if '"segment"' in x[:30]]
    assert any(x["is_expandable"] for x in segs)


def test_the_same_file_imported_twice_is_stored_once(original, tmp_path, capsys):
    root, store, ids = original
    exported = tmp_path / "oom.jsonl"
    run(capsys, "export", ids["oom"], "--format", "jsonl", "-o", str(exported), "--store", store)
    dst = str(tmp_path / "b")
    first = json.loads(run(capsys, "import", str(exported), "--store", dst, "--json"))["traces"]
    again = json.loads(run(capsys, "import", str(exported), "--store", dst, "--json"))["traces"]
    assert [t["id"] for t in again] == [t["id"] for t in first] == [ids["oom"]]
    assert again[0]["stored_before"] is True and len(open_store(dst).list()) == 1
    tagged = json.loads(run(capsys, "import", str(exported), "--store", dst, "--json", "--tag", "k=v"))["traces"]
    assert tagged[0]["id"] != ids["oom"] and len(open_store(dst).list()) == 2  # other tags: another trace, a new id
    # into the store it came from: its id is taken there, so the copy gets a new one
    [back] = json.loads(run(capsys, "import", str(exported), "--store", store, "--json"))["traces"]
    assert back["id"] != ids["oom"]
    assert run(capsys, "rm", back["id"], "--store", store)


def test_postgresql_keeps_the_id_and_the_bytes_and_copies_back(original, pg_url, tmp_path, capsys):
    """The export imported into PostgreSQL, then `store copy` back to a folder: the id and every stored byte kept."""
    root, store, ids = original
    exported = tmp_path / "ranks.jsonl"
    run(capsys, "export", ids["ranks"], "--format", "jsonl", "-o", str(exported), "--store", store)
    [t] = json.loads(run(capsys, "import", str(exported), "--store", pg_url, "--json"))["traces"]
    assert t["id"] == ids["ranks"]
    again = json.loads(run(capsys, "import", str(exported), "--store", pg_url, "--json"))["traces"]
    assert again[0]["stored_before"] is True and len(open_store(pg_url).list()) == 1
    back = str(tmp_path / "back")
    assert json.loads(run(capsys, "store", "copy", pg_url, back, "--json"))["copied"] == [ids["ranks"]]
    assert stored_rows(back, ids["ranks"]) == stored_rows(store, ids["ranks"])
    for ref in (f"{ids['ranks']}:0", f"{ids['ranks']}:1"):
        assert run(capsys, "state", ref, "--event", "peak", "--json", "--store", pg_url) == \
            run(capsys, "state", ref, "--event", "peak", "--json", "--store", store)
