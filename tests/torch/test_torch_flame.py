"""The memory flamegraph of real snapshots: its root is the bytes live at the entry, its leaves are the peak
view's call sites with the same bytes; the SVG is well-formed and draws every box; `alloctrace flame`."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from alloctrace.cli import main
from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.explain import torch_flame_svg as flame_svg
from alloctrace.traces.explain.torch_flame import flame, folded
from alloctrace.traces.state.torch_device import load_device
from alloctrace.traces.explain.torch_peak import peak
from torchsnap import DATA, sidecar

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("flame")
    store = open_store(str(root / "s"))
    ids = {n: import_paths(store, [DATA / f"{n}.pickle.gz"])[0] for n in ("gpt2_train_bs8", "oom")}
    return root, store, ids


def own_bytes(tree) -> Counter:
    """Bytes of the stacks that end at each node, by node name."""
    c = Counter()

    def walk(n):
        own = n["value"] - sum(k["value"] for k in n["children"])
        if own:
            c[n["name"]] += own
        for k in n["children"]:
            walk(k)
    walk(tree)
    return c


@pytest.mark.parametrize("name", ["gpt2_train_bs8", "oom"])
def test_leaves_are_the_call_sites_of_the_peak(stored, name):
    _, store, ids = stored
    dev = load_device(store, ids[name], 0)
    f = flame(dev, min_share=0)
    p = peak(dev, top=100_000)
    assert f["event"] == p["event"] and f["bytes"] == p["peak_requested"]
    assert f["bytes"] == sidecar(name)["memory_stats_subset"]["requested_bytes.all.peak"]
    assert own_bytes(f["tree"]) == Counter({g["site"]: g["bytes"] for g in p["by_call_site"]})
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded(f["tree"])) == f["bytes"]


def test_autograd_entries_are_named_by_their_annotation(stored):
    _, store, ids = stored
    f = flame(load_device(store, ids["gpt2_train_bs8"], 0), at=5000, min_share=0)
    names = own_bytes(f["tree"])
    assert any(n.startswith("(no Python stack) in ") for n in names), sorted(names)[:5]


def test_pruning_bounds_the_tree_and_keeps_the_total(stored):
    _, store, ids = stored
    dev = load_device(store, ids["oom"], 0)
    full, pruned = flame(dev, min_share=0), flame(dev, min_share=0.05)

    def count(n):
        return 1 + sum(count(k) for k in n["children"])
    assert count(pruned["tree"]) < count(full["tree"]) and pruned["bytes"] == full["bytes"]

    def sums_up(n):
        return n["value"] >= sum(k["value"] for k in n["children"]) and all(sums_up(k) for k in n["children"])
    assert sums_up(pruned["tree"])


def test_svg_is_well_formed_and_draws_the_tree(stored):
    _, store, ids = stored
    f = flame(load_device(store, ids["oom"], 0), at="oom")
    doc = ET.fromstring(flame_svg.svg(f))
    boxes = doc.findall(f"{SVG}g")
    assert len(boxes) >= 10
    titles = [g.find(f"{SVG}title").text for g in boxes]
    assert titles[0].startswith(f"all: ") and f"{f['bytes']:,} B" in titles[0]
    widths = [float(g.find(f"{SVG}rect").get("width")) for g in boxes]
    assert max(widths) == widths[0] == pytest.approx(flame_svg.WIDTH - 2 * flame_svg.PAD)


def test_flame_command(stored, capsys):
    root, store, ids = stored
    s = str(root / "s")
    out = root / "f.svg"
    assert main(["flame", ids["oom"], "--store", s, "--at", "oom", "-o", str(out)]) == 0
    ET.parse(out)
    assert main(["flame", ids["oom"], "--store", s, "-o", str(root / "f.html")]) == 0
    assert (root / "f.html").read_text().count("<svg") == 1
    capsys.readouterr()
    assert main(["flame", ids["oom"], "--store", s]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.rsplit(" ", 1)[1].isdigit() for line in lines)
    for bad in (["--at", "nope"], ["--at", "99999999"], ["-o", str(root / "f.png")]):
        assert main(["flame", ids["oom"], "--store", s, *bad]) == 2
    assert main(["flame", ids["gpt2_train_bs8"], "--store", s, "--at", "oom"]) == 2
    assert "has no OOM" in capsys.readouterr().err


def test_a_wrapped_trace_says_so_and_keeps_its_level(tmp_path, capsys):
    store = open_store(str(tmp_path / "s"))
    [tid] = import_paths(store, [DATA / "pairs" / "train_wrapped.pickle.gz"])
    dev = load_device(store, tid, 0)
    f = flame(dev, min_share=0)
    assert f["partial"].startswith("partial trace") and f["bytes"] == int(dev.curves()[0][f["event"]])
    assert f["bytes"] == peak(dev)["peak_requested"]
    assert main(["flame", tid, "--store", str(tmp_path / "s"), "-o", str(tmp_path / "w.svg")]) == 0
    assert "alloctrace: partial trace" in capsys.readouterr().err


def test_cpp_frames_are_never_boxes(tmp_path):
    store = open_store(str(tmp_path / "s"))
    [tid] = import_paths(store, [DATA / "pairs" / "mlp_stacks_all.pickle.gz"])
    dev = load_device(store, tid, 0)
    f = flame(dev, min_share=0)
    names = []

    def walk(n):
        names.append(n["name"])
        for k in n["children"]:
            walk(k)
    walk(f["tree"])
    assert len(names) > 3
    assert not [n for n in names if ".so" in n or n.startswith("??") or "python3" in n]
    assert own_bytes(f["tree"]) == Counter({g["site"]: g["bytes"] for g in peak(dev, top=100_000)["by_call_site"]})
