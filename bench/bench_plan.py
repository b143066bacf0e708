"""`alloctrace plan` against the real runs: accuracy table and wall time.

    python bench/bench_plan.py [--markdown]
    python bench/bench_plan.py --resnet [--markdown]    # ResNet-50 with cuDNN's workspaces measured on the GPU
    python bench/bench_plan.py --orders [--markdown]    # every point recorded in a fresh process: the answer's
                                                        # error and its range over the address orders
    python bench/bench_plan.py --searches               # largest batch under each cap of truths.json: the
                                                        # search given captures against one given full plans
    python bench/bench_plan.py --replay [--rounds 5]    # replaying captured steps in every address order: the
                                                        # pools' plain sorted lists against SortedLists

For every model x dtype x batch of tests/data/torch/plan/truths.json (recorded on an H200 by
bench/record_torch_plan_truths.py): the real max_memory_allocated / max_memory_reserved, the predicted ones and
the errors; the wall time of `plan` (capture + replay, two training steps) as a ratio to the real two steps'
wall time on the GPU (from the truths) and to the same steps' plain CPU run at batch 1 measured here.
`--resnet`: ResNet-50's runs of more.json, planned with the workspace table recorded at every batch from 1 to 256
(resnet50_scratch.json.gz); then the largest batch under more.json's cap, planned with that table and with its
every-8th batches alone (interpolated in between), against the trial on the GPU.
`--searches`: each largest-batch search twice in one run, its points given as captures (64 address orders
replayed only where the answer reads them) and as plans replayed under every order, the captures made once for
both: the two answers, and each search's replay time and whole time (capturing included) as ratios.
`--replay`: the steps of truths.json's first batch per model and dtype, captured once, each replayed in all 64
address orders under three settings, with the pools' free blocks in plain sorted lists (the model as it is)
and in SortedLists throughout (LIST_POOL_LIMIT 0, as before), the two in turn for --rounds rounds: the same
answers, and the median ratio of the replay CPU time.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import time
import types
from functools import cache
from pathlib import Path

from alloctrace.allocator.cuda_caching import AllocatorSettings
from alloctrace.traces.preflight import torch_plan, torch_scratch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "torch" / "plan"
TRUTHS = json.loads((DATA / "truths.json").read_text())


def _load(device: str):
    path = ROOT / "bench" / "torch_plan_workloads.py"
    if device == "cuda":
        spec = importlib.util.spec_from_file_location("torch_plan_workloads", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    mod = types.ModuleType("torch_plan_workloads_cpu")     # the same steps, every "cuda" made "cpu"
    exec(compile(path.read_text().replace('"cuda"', '"cpu"'), str(path), "exec"), mod.__dict__)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--resnet", action="store_true")
    ap.add_argument("--orders", action="store_true")
    ap.add_argument("--searches", action="store_true")
    ap.add_argument("--replay", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.replay:
        return replay_pools(args.rounds)
    if args.searches:
        return searches()
    if args.resnet:
        return resnet(args.markdown)
    if args.orders:
        return orders(args.markdown)
    w, cpu = _load("cuda"), _load("cpu")
    cpu_wall = {}
    for name in w.MODELS:
        t0 = time.perf_counter()
        cpu.train(name, 1, "fp32")
        cpu_wall[name] = time.perf_counter() - t0
    rows = []
    for r in TRUTHS["runs"]:
        t0 = time.perf_counter()
        p = torch_plan.plan_callable(w.train, r["model"], r["batch"], r["dtype"])
        wall = time.perf_counter() - t0
        ea = (p.peak_allocated - r["max_memory_allocated"]) / r["max_memory_allocated"] * 100
        er = (p.peak_reserved - r["max_memory_reserved"]) / r["max_memory_reserved"] * 100
        rows.append((r["model"], r["dtype"], r["batch"], r["max_memory_allocated"], p.peak_allocated, ea,
                     r["max_memory_reserved"], p.peak_reserved, er, wall, wall / r["wall_s"],
                     wall / cpu_wall[r["model"]]))
    head = ("model", "dtype", "batch", "real allocated", "predicted", "error", "real reserved", "predicted",
            "error", "plan wall", "/ GPU steps", "/ CPU batch 1")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for x in rows:
        cells = [x[0], x[1], str(x[2]), f"{x[3]:,}", f"{x[4]:,}", f"{x[5]:+.2f}%", f"{x[6]:,}", f"{x[7]:,}",
                 f"{x[8]:+.2f}%", f"{x[9]:.2f} s", f"{x[10]:.0f}x", f"{x[11]:.2f}x"]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))


def resnet(markdown: bool):
    more = json.loads((DATA / "more.json").read_text())
    recorded = _resnet_recorded()
    table = _resnet_table()
    every_8th = torch_scratch.measured_table({"runs": [r for r in recorded["runs"] if r["batch"] % 8 == 0]})
    w = _load("cuda")
    head = ("dtype", "batch", "real allocated", "predicted", "error", "real reserved", "predicted", "error",
            "plan wall")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for r in more["runs"]:
        t0 = time.perf_counter()
        p = torch_plan.plan_callable(w.train, "resnet50", r["batch"], r["dtype"], measured=table)
        wall = time.perf_counter() - t0
        ea = (p.peak_allocated - r["max_memory_allocated"]) / r["max_memory_allocated"] * 100
        er = (p.peak_reserved - r["max_memory_reserved"]) / r["max_memory_reserved"] * 100
        cells = [r["dtype"], str(r["batch"]), f"{r['max_memory_allocated']:,}", f"{p.peak_allocated:,}",
                 f"{ea:+.2f}%", f"{r['max_memory_reserved']:,}", f"{p.peak_reserved:,}", f"{er:+.2f}%",
                 f"{wall:.2f} s"]
        print("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells), flush=True)
    for truth in more["largest"]:
        got = []
        for t in (table, every_8th):
            t0 = time.perf_counter()
            ans = torch_plan.largest_fitting(
                lambda v, s: torch_plan.plan_callable(w.train, "resnet50", v, truth["dtype"], settings=s, measured=t),
                64, 256, truth["cap"], AllocatorSettings())
            got.append(f"{ans['value']} ({len(ans['points'])} points, {time.perf_counter() - t0:.1f} s)")
        print(f"largest batch under {truth['cap']:,} B, {truth['dtype']}: trial {truth['value']}, "
              f"every batch recorded {got[0]}, every 8th interpolated {got[1]}", flush=True)


def searches():
    """The search given captures against the same search given plans replayed under every order."""
    w = _load("cuda")
    for truth in TRUTHS["largest"]:
        tried = [int(v) for v in truth["tried"]]
        caps: dict = {}
        capture_s = 0.0

        def captured(v, _settings):
            nonlocal capture_s
            if v not in caps:
                t0 = time.process_time()
                caps[v] = torch_plan.capture_callable(w.train, truth["model"], v, truth["dtype"])
                capture_s += time.process_time() - t0
            return caps[v]

        t0 = time.process_time()
        lazy = torch_plan.largest_fitting(captured, min(tried), max(tried), truth["cap"], AllocatorSettings())
        lazy_s = time.process_time() - t0 - capture_s
        t0 = time.process_time()
        full = torch_plan.largest_fitting(lambda v, s: torch_plan.replay(captured(v, s), s), min(tried),
                                          max(tried), truth["cap"], AllocatorSettings())
        full_s = time.process_time() - t0
        same = all(lazy[k] == full[k] for k in ("value", "value_every_order", "address_orders"))
        print(f"{truth['model']} {truth['dtype']}: {len(caps)} points, answer {lazy['value']} "
              f"(every order {lazy['value_every_order']}), the same both ways: {same}; replays "
              f"{lazy_s:.2f} s against {full_s:.2f} s ({lazy_s / full_s:.2f}x); with the captures "
              f"({capture_s:.2f} s) {(lazy_s + capture_s) / (full_s + capture_s):.2f}x", flush=True)


def replay_pools(rounds: int):
    """Every address order of captured steps replayed with list pools and with SortedList pools, in turn."""
    import statistics

    from alloctrace.allocator import cuda_caching

    w = _load("cuda")
    firsts = {}
    for r in TRUTHS["runs"]:
        firsts.setdefault((r["model"], r["dtype"]), r["batch"])
    caps = [torch_plan.capture_callable(w.train, m, b, d) for (m, d), b in firsts.items()]
    settings = [AllocatorSettings(), AllocatorSettings(max_split_size=64 << 20),
                AllocatorSettings(expandable_segments=True)]

    def run(limit: int) -> tuple[float, list]:
        cuda_caching.LIST_POOL_LIMIT, answers = limit, []
        t0 = time.process_time()
        for cap in caps:
            for s in settings:
                p = torch_plan.replay(cap, s)
                answers.append((p.peak_allocated_range, p.peak_reserved_range, p.oom_orders, p.categories))
        return time.process_time() - t0, answers

    default, ratios = cuda_caching.LIST_POOL_LIMIT, []
    try:
        for _ in range(rounds):
            (lists_s, a), (sorted_s, b) = run(default), run(0)
            assert a == b, "list pools and SortedList pools disagree"
            ratios.append(lists_s / sorted_s)
            print(f"{len(caps)} steps x {len(settings)} settings x 64 orders: lists {lists_s:.2f} s, "
                  f"SortedLists {sorted_s:.2f} s ({ratios[-1]:.2f}x)", flush=True)
    finally:
        cuda_caching.LIST_POOL_LIMIT = default
    print(f"median of {rounds} rounds: list pools replay in {statistics.median(ratios):.2f}x the time of "
          f"SortedList pools, with the same answers")


def _pct(got: int, real: int) -> str:
    return f"{(got - real) / real * 100:+.2f}%"


def orders(markdown: bool):
    """segments.json, held_out.json and held_out_driver.json (the last recorded after the driver order was fitted
    to the first two): per point the answer's error and the ends of its range against the H200, and how many
    address orders were replayed."""
    w = _load("cuda")
    head = ("recorded", "model", "dtype", "batch", "allocated", "range", "reserved", "range", "orders")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    exact = within = n = 0
    for name in ("segments", "held_out", "held_out_driver"):
        seen = set()
        for r in json.loads((DATA / f"{name}.json").read_text())["runs"]:
            key = (r["model"], r["dtype"], r["batch"])
            if key in seen:
                continue
            seen.add(key)
            measured = _resnet_table() if r["model"] == "resnet50" else None
            p = torch_plan.plan_callable(w.train, r["model"], r["batch"], r["dtype"], measured=measured)
            a, v = r["max_memory_allocated"], r["max_memory_reserved"]
            n += 1
            exact += (p.peak_allocated, p.peak_reserved) == (a, v)
            within += abs(p.peak_allocated - a) <= a / 100 and abs(p.peak_reserved - v) <= 3 * v / 100
            cells = [f"{name}.json", *map(str, key), _pct(p.peak_allocated, a),
                     f"{_pct(p.peak_allocated_range[0], a)} … {_pct(p.peak_allocated_range[1], a)}",
                     _pct(p.peak_reserved, v),
                     f"{_pct(p.peak_reserved_range[0], v)} … {_pct(p.peak_reserved_range[1], v)}",
                     str(p.address_orders)]
            print("| " + " | ".join(cells) + " |" if markdown else "  ".join(cells), flush=True)
    print(f"\n{n} points: both peaks exact at {exact}, within 1 % allocated and 3 % reserved at {within}")


@cache
def _resnet_recorded() -> dict:
    return json.load(gzip.open(DATA / "resnet50_scratch.json.gz", "rt"))


@cache
def _resnet_table():
    """The workspace table a ResNet-50 plan is given: every batch from 1 to 256, read and built once."""
    return torch_scratch.measured_table(_resnet_recorded())


if __name__ == "__main__":
    main()
