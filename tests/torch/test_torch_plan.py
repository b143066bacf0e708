"""`alloctrace plan`: training steps captured on fake CUDA tensors on a CPU, checked against what the caching
allocator really did on an H200 (tests/data/torch/plan/truths.json, bench/record_torch_plan_truths.py)."""
from __future__ import annotations

import difflib
import gzip
import importlib.util
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from alloctrace.allocator.cuda_caching import AllocatorSettings  # noqa: E402
from alloctrace.traces.preflight import torch_capture, torch_plan, torch_scratch  # noqa: E402
from torchsnap import bench_module, plan_answer, plan_sequence, plan_workloads  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "torch" / "plan"
TRUTHS = json.loads((DATA / "truths.json").read_text())


W = plan_workloads()


def _runs(models):
    return [pytest.param(r, id=f"{r['model']}-{r['dtype']}-b{r['batch']}") for r in TRUTHS["runs"]
            if r["model"] in models]


@pytest.mark.parametrize("run", _runs(("mlp",)))
def test_mlp_peaks_are_exact(run):
    p = plan_answer(W.train, run["model"], run["batch"], run["dtype"])
    assert not p.partial
    assert p.peak_allocated == pytest.approx(run["max_memory_allocated"], rel=0.002)
    assert p.peak_reserved == pytest.approx(run["max_memory_reserved"], rel=0.05)


@pytest.mark.parametrize("run", _runs(("gpt", "vit")))
def test_transformer_peaks_within_tolerance(run):
    p = plan_answer(W.train, run["model"], run["batch"], run["dtype"])
    assert not p.partial
    assert p.peak_allocated == pytest.approx(run["max_memory_allocated"], rel=0.0125)
    assert p.peak_reserved == pytest.approx(run["max_memory_reserved"], rel=0.03)


def test_most_predictions_are_exact_to_the_byte():
    exact = 0
    for run in TRUTHS["runs"]:
        if run["model"] != "mlp" and run["batch"] != W.BATCHES[run["model"]][1]:
            continue
        p = plan_answer(W.train, run["model"], run["batch"], run["dtype"])
        exact += p.peak_allocated == run["max_memory_allocated"]
    assert exact >= 8          # of 10 (all MLP points, the middle batch of the others)


@pytest.mark.parametrize("model,dtype", [("mlp", "fp32"), ("mlp", "bf16"), ("gpt", "fp32")])
def test_largest_batch_under_a_cap_is_the_one_found_by_trial(model, dtype):
    truth = next(x for x in TRUTHS["largest"] if (x["model"], x["dtype"]) == (model, dtype))
    top = W.BATCHES[model][-1]
    ans = torch_plan.largest_fitting(lambda v, s: plan_answer(W.train, model, v, dtype, settings=s),
                                     1, top * 8, truth["cap"], AllocatorSettings())
    assert ans["value"] == truth["value"]
    for p in ans["points"]:                   # every point the real bisection also tried agrees
        real = truth["tried"].get(str(p["value"]))
        assert real is None or real == p["fits"]


def _sequence_alignment(name, dtype, batch) -> float:
    snap = pickle.load(gzip.open(DATA / f"{name}_{dtype}_b{batch}.pickle.gz"))
    real = [(e["action"][:5], e["size"]) for e in snap["device_traces"][0] if e["action"] in ("alloc", "free_requested")]
    with torch_capture.capture() as c:
        W.train(name, batch, dtype)
    mine = plan_sequence(c.events)
    sm = difflib.SequenceMatcher(None, real, mine, autojunk=False)
    same = sum(real[i][1] for tag, i1, i2, _, _ in sm.get_opcodes() if tag == "equal" for i in range(i1, i2)
               if real[i][0] == "alloc")
    return same / sum(s for a, s in real if a == "alloc")


@pytest.mark.parametrize("snapshot", ["mlp_fp32_b256", "gpt_fp32_b8", "gpt_bf16_b8", "vit_bf16_b32"])
def test_allocation_sequence_follows_the_real_snapshot(snapshot):
    name, dtype, batch = snapshot.split("_")
    assert _sequence_alignment(name, dtype, int(batch[1:])) >= 0.99      # the issue asks for 95 %


def test_capture_categories_and_call_sites():
    with torch_capture.capture() as c:
        W.train("mlp", 8, "fp32", steps=1)
    cats = {c.category[e.key] for e in c.events if e.kind == "alloc"}
    assert {"parameters", "gradients", "optimizer_state", "workspace"} <= cats
    first = next(e for e in c.events if e.kind == "alloc")
    assert first.dtype == "float32" and first.shape == (4096, 1024)
    assert any("torch_plan_workloads.py" in f[0] for f in first.frames)
    alloc = sum(1 for e in c.events if e.kind == "alloc")
    assert alloc > 30 and not c.partial


def _frames_by_traceback(limit: int = 80) -> list:
    """The slow reference of torch_capture._frames: traceback's summary of the same frames, filtered the same way
    (called one frame further out than the walk, as the walk's own frame, it counts its own and drops it)."""
    import traceback

    keep = [(fs.filename, fs.lineno, fs.name) for fs in reversed(traceback.extract_stack(limit=limit)[:-1])]
    return [f for f in keep if not f[0].startswith(torch_capture._OURS)
            and not any(h in f[0] for h in torch_capture.HIDDEN)]


def test_call_sites_walked_by_hand_equal_tracebacks_summary(monkeypatch):
    """Every allocation of a real capture (forward, the engine's backward, the optimizer) and at depths past the
    limit: the frame walk gives what traceback.extract_stack gives."""
    pairs = []
    walk = torch_capture._frames

    def both(limit: int = 80):
        got = walk(limit)
        pairs.append((got, _frames_by_traceback(limit)))
        return got
    monkeypatch.setattr(torch_capture, "_frames", both)
    with torch_capture.capture() as c:
        W.train("gpt", 2, "bf16", steps=1)

    def deep(n):
        return deep(n - 1) if n else both()
    deep(120)
    assert len(pairs) > 100 and not c.partial
    # the first frame is `both` itself, one line apart in the two calls
    assert all(got[0][2] == want[0][2] == "both" and got[1:] == want[1:] for got, want in pairs)
    assert any(len(got) >= 3 for got, _ in pairs) and len(pairs[-1][0]) > 70


def test_a_capture_kept_for_the_run_gives_the_plan_a_fresh_capture_gives():
    from torchsnap import plan_cached

    fresh = torch_plan.plan_callable(W.train, "gpt", 3, "fp32", orders=torch_plan.ADDRESS_ORDERS[:4])
    kept = [plan_cached(W.train, "gpt", 3, "fp32", orders=torch_plan.ADDRESS_ORDERS[:4]) for _ in range(2)]
    for p in kept:
        assert (p.peak_allocated_range, p.peak_reserved_range, p.categories) == \
            (fresh.peak_allocated_range, fresh.peak_reserved_range, fresh.categories)
        assert [(e.kind, e.key, e.size, e.op) for e in p.capture.events] == \
            [(e.kind, e.key, e.size, e.op) for e in fresh.capture.events]
    assert kept[0].capture is not kept[1].capture                 # each test gets its own copy


@pytest.mark.parametrize("name", ["alloctrace", "torch"])
def test_a_users_files_under_a_folder_named_like_this_project_or_torch_keep_their_call_sites(tmp_path, name):
    """Our own frames and torch's are left out by the folders the packages are installed in, not by a name: a
    script in ~/alloctrace/ (a clone of this project, say) or ~/torch/ keeps its call sites and the line that
    names a failure."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "user_step.py").write_text(
        "import torch\n\ndef step():\n    x = torch.ones(1024, 1024, device='cuda')\n    return (x * 2).sum()\n\n"
        "def bad():\n    x = torch.ones(8, device='cuda')\n    return torch.nonzero(x).item()\n")
    spec = importlib.util.spec_from_file_location("user_step", folder / "user_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with torch_capture.capture() as c:
        mod.step()
    first = next(e for e in c.events if e.kind == "alloc")
    assert torch_capture.user_site(first.frames).startswith(f"{folder / 'user_step.py'}:4 (step)")
    with torch_capture.capture() as c:
        mod.bad()
    assert c.partial and f"{folder / 'user_step.py'}:9 (bad)" in c.error, c.error


def test_reduction_scratch_matches_the_recorded_kernel_buffers():
    # sum over 2048 rows of 512 / 2048 / 1536 columns (fp32): buffers and semaphores seen in gpt_fp32_b8
    assert torch_scratch.reduce_scratch((8, 256, 512), [0, 1], 4) == [8388608, 16]
    assert torch_scratch.reduce_scratch((8, 256, 2048), [0, 1], 4) == [33554432, 64]
    assert torch_scratch.reduce_scratch((8, 256, 1536), [0, 1], 4) == [25165824, 48]
    assert torch_scratch.reduce_scratch((256, 4096), [0], 4) == []        # too few rows to split


def test_a_data_dependent_step_is_kept_partial_with_one_line(tmp_path):
    script = tmp_path / "item.py"
    script.write_text("import torch\nx = torch.randn(1024, 1024, device='cuda')\nif x.sum().item() > 0:\n"
                      "    y = x * 2\n")
    r = subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--json", "--store", str(tmp_path / "s"), "--",
                        "python", str(script)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3
    out = json.loads(r.stdout)
    assert out["partial"] is True and out["peak_allocated"] >= 1024 * 1024 * 4
    line = r.stderr.strip().splitlines()
    assert len(line) == 1 and "item.py:3" in line[0]


def test_a_script_without_cuda_is_one_line(tmp_path):
    script = tmp_path / "cpu.py"
    script.write_text("import torch\nx = torch.randn(8, 8)\n")
    r = subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--no-store", "--", "python", str(script)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "never allocated on a CUDA device" in r.stderr


@pytest.mark.parametrize("args", [["--vary", "batch=8..x", "--budget", "1GiB"], ["--vary", "batch=64..8", "--budget", "1GiB"],
                                  ["--vary", "batch=8..64", "--budget", "lots"], ["--budget", "1GiB"]])
def test_malformed_budget_or_range_is_one_line_exit_2(args, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print('never run')\n")
    r = subprocess.run([sys.executable, "-m", "alloctrace", "plan", *args, "--", "python", str(script), "{batch}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("alloctrace: error:") and r.stderr.count("\n") == 1
    assert "never run" not in r.stdout


def test_cli_json_answers_and_vary(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys, importlib.util\n"
                      f"spec = importlib.util.spec_from_file_location('w', {str(ROOT / 'bench' / 'torch_plan_workloads.py')!r})\n"
                      "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
                      "w.train('mlp', int(sys.argv[1]), 'fp32')\n")
    store = ["--store", str(tmp_path / "store")]
    r = subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--json", "--total", "300MiB", *store, "--",
                        "python", str(script), "256"], capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["oom"]["request"] == 67108864 and out["oom"]["total"] == 300 << 20
    assert set(out["categories"]) >= {"parameters", "gradients"}
    assert "torch_plan_workloads.py" in out["oom"]["site"]
    peak = subprocess.run([sys.executable, "-m", "alloctrace", "peak", out["trace"], *store, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert peak.returncode == 0, peak.stderr
    assert json.loads(peak.stdout)
    truth = next(x for x in TRUTHS["largest"] if (x["model"], x["dtype"]) == ("mlp", "fp32"))
    r = subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--json", "--vary", "batch=1..8192", "--budget",
                        str(truth["cap"]), *store, "--", "python", str(script), "{batch}"],
                       capture_output=True, text=True, timeout=300)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["value"] == truth["value"]
    assert all({"value", "peak_reserved", "fits"} <= set(p) for p in out["points"])
    assert out["laws"]["parameters"]["b_per_unit"] == 0
    ids = [p["trace"] for p in out["points"]]             # every point tried is stored, each its own trace
    assert len(set(ids)) == len(ids) == len(out["points"])
    fits = next(p for p in out["points"] if p["value"] == truth["value"])
    peak = subprocess.run([sys.executable, "-m", "alloctrace", "peak", fits["trace"], *store, "--json"],
                          capture_output=True, text=True, timeout=300)
    assert peak.returncode == 0, peak.stderr


def test_cli_says_how_far_the_peaks_move_with_where_segments_land(tmp_path):
    """MLP fp32 batch 256: the plan's own order (the driver's) gives the H200's 396,361,728 B reserved, new
    segments always below the older ones 379,584,512 B; both are in the range the answer prints, and --json
    carries it."""
    script = tmp_path / "train.py"
    script.write_text("import sys, importlib.util\n"
                      f"spec = importlib.util.spec_from_file_location('w', {str(ROOT / 'bench' / 'torch_plan_workloads.py')!r})\n"
                      "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
                      "w.train('mlp', int(sys.argv[1]), 'fp32')\n")
    real = next(r for r in TRUTHS["runs"] if (r["model"], r["dtype"], r["batch"]) == ("mlp", "fp32", 256))
    runs = {mode: subprocess.run([sys.executable, "-m", "alloctrace", "plan", "--no-store", *mode, "--", "python",
                                  str(script), "256"], capture_output=True, text=True, timeout=300)
            for mode in [(), ("--json",)]}
    assert all(r.returncode == 0 for r in runs.values()), [r.stderr for r in runs.values()]
    out = json.loads(runs[("--json",)].stdout)
    lo, hi = out["peak_reserved_range"]
    assert out["address_sensitive"] and lo <= out["peak_reserved"] <= hi and lo < hi
    assert lo <= real["max_memory_reserved"] <= hi and out["address_orders"] == len(torch_plan.ADDRESS_ORDERS)
    line = next(x for x in runs[()].stdout.splitlines() if x.startswith("depends on where the driver puts segments"))
    assert f"reserved {lo:,}-{hi:,} B over {out['address_orders']} address orders" in line
    assert out["answer_address_order"] == "driver" and "H200" in out["driver_order_source"]
    assert line.endswith(f"(the answer places them as {out['driver_order_source']})")


def _user_frames_only(snap: dict) -> dict:
    """Both sides' stacks down to the workload's own frames (the torch frames differ by version and machine)."""
    for e in snap["device_traces"][0]:
        e["frames"] = [dict(f, filename="torch_plan_workloads.py") for f in e.get("frames", [])
                       if f["filename"].endswith("torch_plan_workloads.py")]
    return snap


@pytest.mark.parametrize("snapshot", ["mlp_fp32_b256", "gpt_bf16_b8"])
def test_stored_plan_aligns_with_the_real_snapshot_by_the_torch_diff(snapshot, tmp_path):
    import io

    from alloctrace.traces.diff.torch_snapshots import align
    from alloctrace.traces.preflight import torch_plan_store
    from alloctrace.traces.sources import import_file
    from alloctrace.traces.state.torch_device import load_device
    from alloctrace.traces.store.store import open_store

    name, dtype, batch = snapshot.split("_")
    p = plan_answer(W.train, name, int(batch[1:]), dtype)
    planned = _user_frames_only(torch_plan_store.snapshot_of(p.capture, AllocatorSettings()))
    real = _user_frames_only(pickle.load(gzip.open(DATA / f"{snapshot}.pickle.gz")))
    store = open_store(str(tmp_path / "store"))
    ids = [import_file(store, io.BytesIO(pickle.dumps(s)), filename="x.pickle")[0]["id"] for s in (planned, real)]
    summary = store.summary(ids[0])
    assert summary["graphs"][0]["consistent"] is True
    a, b = load_device(store, ids[0], 0), load_device(store, ids[1], 0)
    al = align(a, b)
    sizes = b.allocations().size
    assert sizes[al["b_rows"]].sum() / sizes.sum() >= 0.99


VARIANTS = json.loads((DATA / "variants.json").read_text())


@pytest.mark.parametrize("run", [pytest.param(r, id=f"{r['model']}-{r['dtype']}-{r['variant']}") for r in VARIANTS
                                 if r["variant"] != "checkpoint"])
def test_accumulation_zero_grad_keeping_grads_and_fp16_grad_scaler(run):
    p = plan_answer(W.train_variant, run["model"], run["batch"], run["dtype"],
                                 **W.VARIANTS.get(run["variant"], {}))
    assert not p.partial
    assert p.peak_allocated == pytest.approx(run["max_memory_allocated"], rel=0.01)
    assert p.peak_reserved == pytest.approx(run["max_memory_reserved"], rel=0.03)
    if run["dtype"] == "fp32":
        assert p.peak_allocated == run["max_memory_allocated"]


def test_compile_stops_the_step_with_one_named_line():
    def compiled():
        with torch.device("cuda"):
            lin = torch.nn.Linear(8, 8)
        torch.compile(lin)(torch.randn(4, 8, device="cuda"))

    p = plan_answer(compiled)
    assert p.partial and "torch.compile" in p.error
    assert torch.compile.__name__ == "compile"       # put back after the capture


@pytest.mark.parametrize("layer,name", [("LSTM", "nn.LSTM"), ("GRU", "nn.GRU"), ("RNN", "nn.RNN")])
def test_a_recurrent_layer_on_cuda_stops_the_step_with_one_named_line(layer, name):
    """On a GPU the layer is one call of cuDNN's RNN kernel, which a plan does not follow: without the refusal a
    CUDA build of PyTorch stopped in the kernel's setup ("CUDA driver version is insufficient") and a CPU build
    would run the step by step path the GPU never takes."""
    import torch._VF as vf

    def step():
        with torch.device("cuda"):
            rnn = getattr(torch.nn, layer)(16, 32, num_layers=2, batch_first=True)
            x = torch.randn(4, 10, 16)
        out, _ = rnn(x)
        out.sum().backward()

    p = plan_answer(step)
    assert p.partial and p.error.startswith(f"NotImplementedError: {name} on a CUDA device runs cuDNN's RNN kernel")
    assert f"{Path(__file__).name}:" in p.error and "(step)" in p.error          # the user's call site
    assert p.peak_allocated > 0                                                # the weights before it
    assert not {"lstm", "gru", "rnn_tanh", "rnn_relu"} & set(vf.__dict__)      # put back after the capture
    out, _ = getattr(torch.nn, layer)(4, 4)(torch.randn(3, 2, 4))               # and runs as before
    assert out.shape == (3, 2, 4)


def test_convolutions_without_a_measured_table_are_named_as_not_included():
    """cuDNN picks a convolution's workspace on the GPU at run time (through the caching allocator): without a
    table measured there the plan leaves it out, and says so."""
    from alloctrace.commands.plan import plan_lines

    def step():
        torch.nn.Conv2d(3, 8, 3)(torch.randn(1, 3, 8, 8))         # on the host: no cuDNN, nothing left out
        with torch.device("cuda"):
            conv = torch.nn.Conv2d(3, 8, 3)
            x = torch.randn(2, 3, 16, 16)
        conv(x).sum().backward()

    out = plan_answer(step).as_dict()
    assert out["unmeasured_workspaces"] == {"convolution": 1, "convolution_backward": 1}
    said = [x for x in plan_lines(out) if x.startswith("not included")]
    assert len(said) == 1 and "cuDNN's workspaces of 2 convolution calls" in said[0]
    plain = plan_answer(W.train, "mlp", 8, "fp32").as_dict()
    assert plain["unmeasured_workspaces"] == {} and not [x for x in plan_lines(plain) if "not included" in x]


def test_a_recurrent_layer_on_the_cpu_runs_inside_a_capture():
    def step():
        out, _ = torch.nn.LSTM(8, 8)(torch.randn(3, 2, 8))
        torch.zeros(out.shape, device="cuda")

    p = plan_answer(step)
    assert not p.partial, p.error
    assert p.peak_allocated == 512                    # the one CUDA block: 3 x 2 x 8 fp32, rounded to 512 B


def test_python_api_context_manager_and_card_size():
    import alloctrace.torch

    with alloctrace.torch.plan(device="cuda:0") as p:
        W.train("mlp", 256, "fp32")
    truth = next(r for r in TRUTHS["runs"] if (r["model"], r["dtype"], r["batch"]) == ("mlp", "fp32", 256))
    assert p.result.peak_allocated == truth["max_memory_allocated"] and p.result.oom is None
    with alloctrace.torch.plan(device="cuda:0", total="300MiB") as p:
        W.train("mlp", 256, "fp32")
    assert p.result.oom["request"] == 67108864 and p.result.oom["reserved"] + 67108864 > 300 << 20
    with pytest.raises(Exception, match="CUDA devices"):
        with alloctrace.torch.plan(device="cpu"):
            pass
    assert {e.phase for e in p.capture.events} >= {"forward", "backward"}


def test_fp16_with_a_grad_scaler_runs_to_the_optimizer_step():
    import torch.amp.grad_scaler as gs

    before = gs.GradScaler._maybe_opt_step
    p = plan_answer(W.train_variant, "mlp", 64, "fp16", steps=1)
    assert not p.partial, p.error
    assert p.categories.get("optimizer_state", 0) >= 4 * 25076712      # SGD's momentum for every parameter
    assert gs.GradScaler._maybe_opt_step is before


def test_memory_outside_the_allocator_is_the_measured_one_and_kept_apart():
    measured = json.loads((DATA / "context.json").read_text())["outside_allocator"]
    steps = list(measured.values())
    o = torch_plan.OUTSIDE_ALLOCATOR
    assert o["bytes"] == steps[-1] and o["context"] == steps[0]
    assert o["context"] + o["cublas_handles"] + o["autograd_thread"] == o["bytes"]
    p = plan_answer(W.train, "mlp", 64, "fp32")
    run = TRUTHS["runs"][0]
    assert p.peak_allocated == run["max_memory_allocated"]          # not folded into the prediction
    assert p.as_dict()["outside_allocator"]["bytes"] == steps[-1] and f"{steps[-1]:,}" in p.as_dict()["unseen"]


def test_the_gpu_recording_keys_ops_as_the_plan_looks_them_up():
    """bench/record_torch_plan_truths.py (run on a GPU machine without the package) writes the measured tables'
    keys; torch_scratch.op_signature reads them: the same text for the same op and arguments."""
    import torch

    rec = bench_module("record_torch_plan_truths")
    cases = [(torch.zeros(2, 3), 1, None, [torch.ones(4, dtype=torch.bfloat16)], 0.5, True), (), (torch.zeros(0),)]
    for args in cases:
        assert rec.op_key("convolution.default", args) == torch_scratch.op_signature("convolution.default", args)


NOT_MONOTONE = json.loads((DATA / "not_monotone.json").read_text())["runs"]


@pytest.mark.parametrize("run", [pytest.param(r, id=f"{r['model']}-{r['dtype']}") for r in NOT_MONOTONE])
def test_under_a_cap_a_batch_can_fail_below_one_that_fits_and_the_plan_says_which(run):
    """On the H200 under truths.json's cap, MLP bf16 fits at 4,160 and 5,000-5,298 but not at 4,161-4,500, ViT bf16
    at 104 and 106 but not at 105 (not_monotone.json): where the allocator's blocks round decides it. The plan
    gives the same answer at every one of those batches, so "the largest batch" is the one a bisection over the
    same range meets, on the GPU and in the plan alike."""
    settings = AllocatorSettings(memory_limit=run["cap"])
    got = {v: plan_answer(W.train, run["model"], int(v), run["dtype"], settings=settings).oom is None
           for v in run["fits"]}
    assert got == run["fits"]
    values = sorted(int(v) for v in run["fits"])
    assert any(not run["fits"][str(a)] and run["fits"][str(b)] for a, b in zip(values, values[1:]))
