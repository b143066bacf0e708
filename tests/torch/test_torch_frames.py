"""Call sites of stacks with C++ frames: a real snapshot recorded with stacks="all" (tests/data/torch/pairs/
mlp_stacks_all: a small MLP, two SGD steps, on an H200) and the frame shapes other symbolizers write."""
import gzip
import pickle
from pathlib import Path

import pytest

from alloctrace.traces.sources import import_paths
from alloctrace.traces.store.store import open_store
from alloctrace.traces.explain import torch_peak
from alloctrace.traces.state import torch_device as views
from alloctrace.traces.state.torch_frames import DEFAULT_SKIP, call_site, is_python, parse_skip, site_label

from alloctrace.cli import main

PAIRS = Path(__file__).parents[1] / "data" / "torch" / "pairs"
SNAP = PAIRS / "mlp_stacks_all.pickle.gz"


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("store"))
    [tid] = import_paths(s, [SNAP])
    return views.load_device(s, tid, 0)


def _entries():
    with gzip.open(SNAP) as f:
        return pickle.load(f)["device_traces"][0]


def test_the_fixture_really_has_cpp_frames_before_python_ones():
    es = [e for e in _entries() if e["action"] == "alloc" and e["frames"]]
    mixed = [e for e in es if any(is_python(f) for f in e["frames"]) and not is_python(e["frames"][0])]
    assert len(mixed) >= 10                       # innermost frames are the allocator's C++ ones
    assert all(not is_python(f) for e in es[:3] for f in e["frames"][:3])


def test_peak_sites_are_python_frames_or_autograd_nodes(dev):
    p = torch_peak.peak(dev, top=100)
    sites = {g["site"]: g["bytes"] for g in p["by_call_site"]}
    assert sum(sites.values()) == p["peak_requested"]
    # every forward allocation lands on the script's own lines, every backward one on its autograd node
    for site in sites:
        assert ("bench/record_torch_pairs.py:" in site or "(autograd, no Python stack)" in site
                or site == views.NO_STACK), site
    assert any("AddmmBackward0" in s for s in sites) and any("record_torch_pairs.py:64" in s for s in sites)
    assert not any("c10::" in s or "torch::" in s or "??" in s for s in sites)


def test_no_stack_with_a_python_frame_is_named_by_a_native_one(dev):
    for e in _entries():
        fr = e.get("frames") or []
        pick, kind = call_site(fr, ())              # even with nothing skipped
        if any(is_python(f) for f in fr):
            assert kind == "python" and is_python(pick)


def test_skip_refines_and_never_reaches_native_frames(dev):
    # skipping the script too: the first Python frame left (torch's own nn module), or where every Python frame
    # is skipped (torch.randn called from the script) the innermost Python frame: never a C++ one
    p = torch_peak.peak(dev, skip=parse_skip("default,bench/record_torch_pairs.py"), top=100)
    sites = [g["site"] for g in p["by_call_site"]]
    assert any("torch/nn/modules/linear.py" in s for s in sites)
    for s in sites:
        assert ("torch/nn/modules/" in s or "autograd" in s or s == views.NO_STACK
                or s.startswith("mlp (bench/record_torch_pairs.py:")), s
    assert sum(g["bytes"] for g in p["by_call_site"]) == p["peak_requested"]
    assert parse_skip(None) == DEFAULT_SKIP and parse_skip("default,x/")[-1] == "x/"
    assert parse_skip("x/") == ("x/",)


def test_addr_only_symbolizer_frames():
    """`?? (/usr/bin/python3.12:5775726)`: frames as an unsymbolized build writes them (name ??, the object as
    the file, an offset as the line) are the interpreter's, never the site."""
    py = {"name": "step", "filename": "/home/u/train.py", "line": 42}
    fr = [{"name": "??", "filename": "/usr/lib/libtorch_cuda.so", "line": 1234},
          {"name": "??", "filename": "/usr/bin/python3.12", "line": 5775726},
          {"name": "forward", "filename": "/x/site-packages/torch/nn/modules/linear.py", "line": 125},
          {"name": "??", "filename": "/lib/x86_64-linux-gnu/libc.so.6", "line": 99}, py]
    assert site_label(fr) == "step (/home/u/train.py:42)"
    native_only = [fr[0], fr[1], {"name": "cublasLtMatmul", "filename": "/x/libcublasLt.so.13", "line": 7},
                   {"name": "my_extension_kernel_launch", "filename": "/x/my_ext.so", "line": 0}, fr[3]]
    assert site_label(native_only) == "my_extension_kernel_launch (/x/my_ext.so)"
    assert site_label(native_only, ("my_ext",)) is None


def test_cli_peak_on_the_stacks_all_snapshot(tmp_path, capsys):
    rc = main(["peak", str(SNAP), "--store", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "record_torch_pairs.py:64" in out and "AddmmBackward0" in out and "??" not in out


def test_dladdr_symbolizer_snapshot_names_the_same_sites(dev, tmp_path):
    """The same MLP recorded with TORCH_SYMBOLIZE_MODE=dladdr: frames as `?? (/usr/bin/python3.12:5775726)` and
    `name (libtorch_cpu.so:offset)`, the shape that put 100% of the peak on the interpreter before."""
    with gzip.open(PAIRS / "mlp_stacks_dladdr.pickle.gz") as f:
        es = pickle.load(f)["device_traces"][0]
    assert any(fr["name"] == "??" and fr["filename"].endswith("/python3.12")
               for e in es for fr in e.get("frames") or [])
    s = open_store(tmp_path)
    [tid] = import_paths(s, [PAIRS / "mlp_stacks_dladdr.pickle.gz"])
    other = torch_peak.peak(views.load_device(s, tid, 0), top=100)
    mine = torch_peak.peak(dev, top=100)
    strip = lambda p: {g["site"].rsplit(":", 1)[0] if "record_torch_pairs" in g["site"] else g["site"]: g["bytes"]
                       for g in p["by_call_site"]}
    # same workload, same sites and bytes (the script's lines moved between the two recordings)
    assert sorted(strip(other).values()) == sorted(strip(mine).values())
    assert set(strip(other)) == set(strip(mine))
    assert not any("??" in g["site"] or "python3" in g["site"] for g in other["by_call_site"])


def _f(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


TORCH_LINEAR = _f("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward")
TORCH_CALL = _f("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1751, "_call_impl")


def test_exec_code_names_its_caller_not_torch():
    """Innermost first, as snapshots list them: code run by exec() from train.py is named by train.py's line;
    `python -c` code, with no file above it, by its own <string> line; never by a frame inside torch."""
    from_exec = [TORCH_LINEAR, TORCH_CALL, _f("<string>", 3, "<module>"), _f("/home/u/train.py", 41, "main")]
    assert site_label(from_exec) == "main (/home/u/train.py:41)"
    dash_c = [_f("??", 0, "c10::cuda::CUDACachingAllocator::malloc"), TORCH_LINEAR, TORCH_CALL,
              _f("<string>", 7, "step"), _f("<string>", 12, "<module>")]
    assert site_label(dash_c) == "step (<string>:7)"
    only_torch = site_label([TORCH_LINEAR, TORCH_CALL, _f("<frozen runpy>", 88, "_run_code")])
    assert only_torch.startswith("forward (") and "linear.py:125" in only_torch   # the innermost, as before
