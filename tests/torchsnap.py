"""Test helper: a real snapshot pickle (trusted fixture) as one device's trace columns."""
from __future__ import annotations

import gzip
import hashlib
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
    return bench_module("torch_plan_workloads")


def bench_module(name: str):
    """bench/NAME.py loaded as a module (bench/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def plan_answer(*args, **kwargs):
    """A plan replaying its own address order only: the answer these tests hold (the ranges over every order are
    test_torch_plan_address_orders.py's), without 63 more replays per point."""
    from alloctrace.traces.preflight import torch_plan

    return plan_cached(*args, orders=torch_plan.ADDRESS_ORDERS[:1], **kwargs)


def plan_cached(fn, *args, settings=None, total=None, measured=None, orders=None, **kwargs):
    """torch_plan.plan_callable with the capture kept for the rest of the run: many tests hold the same step
    (model, batch, dtype) to different truths, and a capture is most of a plan's time. A workload of
    bench/torch_plan_workloads.py is captured once per run across the workers (conftest names the folder);
    anything else is captured every time."""
    from alloctrace.allocator.cuda_caching import AllocatorSettings
    from alloctrace.traces.preflight import torch_plan

    cap = _captured(fn, args, kwargs, measured)
    return torch_plan.replay(cap, settings or AllocatorSettings(), total,
                             orders=torch_plan.ADDRESS_ORDERS if orders is None else orders)


def capture_cached(fn, *args, measured=None, **kwargs):
    """torch_plan.capture_callable, kept for the run as plan_cached keeps it."""
    return _captured(fn, args, kwargs, measured)


_DIGESTS: dict = {}


def _measured_digest(measured) -> str | None:
    if measured is None:
        return None
    if id(measured) not in _DIGESTS:            # the table is kept too, so its id is not reused
        body = json.dumps([sorted(measured.exact.items()), sorted((k, sorted(v.items()))
                           for k, v in measured.by_template.items()), sorted(measured.ops)])
        _DIGESTS[id(measured)] = (measured, hashlib.sha256(body.encode()).hexdigest())
    return _DIGESTS[id(measured)][1]


def _captured(fn, args, kwargs, measured):
    import os

    from alloctrace.traces.preflight import torch_plan

    folder = os.environ.get("ALLOCTRACE_TEST_CAPTURES")
    if not folder or getattr(fn, "__module__", None) != "torch_plan_workloads" or "<" in fn.__qualname__:
        return torch_plan.capture_callable(fn, *args, measured=measured, **kwargs)
    key = json.dumps([fn.__qualname__, [repr(a) for a in args], sorted((k, repr(v)) for k, v in kwargs.items()),
                      _measured_digest(measured), os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                      os.environ.get("CUBLASLT_WORKSPACE_SIZE")])
    path = Path(folder) / (hashlib.sha256(key.encode()).hexdigest() + ".pickle")
    try:
        with open(path, "rb") as f:
            return pickle.load(f)               # written by this run's own tests (trusted)
    except FileNotFoundError:
        pass
    cap = torch_plan.capture_callable(fn, *args, measured=measured, **kwargs)
    part = path.with_name(f"{path.name}.{os.getpid()}")
    with open(part, "wb") as f:
        pickle.dump(cap, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(part, path)                      # two workers at once: each writes all of it, the last one stays
    return cap
