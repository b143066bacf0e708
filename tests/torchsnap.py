"""Test helper: a real snapshot pickle (trusted fixture) as one device's trace columns."""
from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np

from alloctrace.allocator.cuda_caching import ACTIONS

DATA = Path(__file__).parent / "data" / "torch"


def load(name: str) -> dict:
    with gzip.open(DATA / f"{name}.pickle.gz") as f:
        return pickle.load(f)


def sidecar(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def columns(entries: list[dict]) -> dict[str, np.ndarray]:
    code = {a: i for i, a in enumerate(ACTIONS)}
    return {
        "action": np.array([code[e["action"]] for e in entries], dtype=np.int8),
        "addr": np.array([e.get("addr", 0) for e in entries], dtype=np.int64),
        "size": np.array([e["size"] for e in entries], dtype=np.int64),
        "stream": np.array([e["stream"] for e in entries], dtype=np.int64),
    }


def plan_sequence(events) -> list[tuple[str, int]]:
    """A plan capture's events as a snapshot's allocation sequence reads: ("alloc", size) and ("free_", size)
    (a free by the size its allocation had), to line up against `device_traces` by action and size."""
    sizes, out = {}, []
    for e in events:
        if e.kind == "alloc":
            sizes[e.key] = e.size
            out.append(("alloc", e.size))
        else:
            out.append(("free_", sizes[e.key]))
    return out


def plan_workloads():
    """bench/torch_plan_workloads.py (the steps the GPU truths were recorded from), loaded as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "torch_plan_workloads.py"
    spec = importlib.util.spec_from_file_location("torch_plan_workloads", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plan_answer(*args, **kwargs):
    """torch_plan.plan_callable replaying the plan's own address order only: the answer these tests hold (the
    ranges over every order are test_torch_plan_address_orders.py's), without 63 more replays per point."""
    from alloctrace.traces.preflight import torch_plan

    return torch_plan.plan_callable(*args, orders=torch_plan.ADDRESS_ORDERS[:1], **kwargs)
