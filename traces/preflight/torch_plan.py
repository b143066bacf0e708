"""`alloctrace plan`: a training step captured on fake CUDA tensors, replayed through the caching-allocator model.

The capture (torch_capture.py) gives the step's storage allocations and frees in program order; here they are
requests to `allocator/cuda_caching.py` under the settings of `PYTORCH_CUDA_ALLOC_CONF`, a memory cap and a
card size. The answer: the predicted `max_memory_allocated()` / `max_memory_reserved()`, fragmentation at the
peak, the bytes per category at the peak, and the OOM card where a request would fail. `largest_fitting`
bisects a numeric knob (the batch size, a sequence length) for the largest value that runs under a budget.

What the CPU cannot see is named, never folded into the prediction: the CUDA context, cuDNN's and other
kernels' scratch that does not go through the caching allocator, NCCL's buffers (`UNSEEN`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

from alloctrace.allocator.cuda_caching import AllocatorSettings, CachingAllocator, OutOfMemory
from alloctrace.allocator.cuda_driver_va import SOURCE as DRIVER_ORDER_SOURCE
from alloctrace.traces.errors import UserError
from alloctrace.traces.preflight import torch_capture
from alloctrace.traces.util.sizes import parse_size
from alloctrace.traces.whatif.torch_model import SimulatedDevice
from alloctrace.traces.whatif.torch_request import apply_overrides

# measured once on a GPU machine (bench/measure_cuda_context.py -> tests/data/torch/plan/context.json): device
# memory a training process holds outside the caching allocator; other driver and library versions differ
OUTSIDE_ALLOCATOR = {"bytes": 785_186_816, "context": 554_500_096, "cublas_handles": 69_206_016,
                     "autograd_thread": 161_480_704,
                     "source": "measured on an H200, torch 2.11.0+cu130, CUDA 13.0 (bench/measure_cuda_context.py)"}
UNSEEN = ("not predicted, outside the caching allocator: the CUDA context, cuBLAS handles and the autograd "
          "thread (785,186,816 B on an H200 with torch 2.11.0+cu130, measured; other versions differ), "
          "cuDNN/cuFFT scratch taken with cudaMalloc, NCCL buffers")
MAX_SEARCH = 64              # at most this many captured points per search
# where the driver puts each new segment, tried in turn: the plan's own order first (the driver's, as seen on an
# H200: allocator/cuda_driver_va.py), then new segments below the older ones, above them, and 61 seeded random
# places. Best fit breaks ties by address, so a peak can move with them (docs/torch-plan.md)
ADDRESS_ORDERS: tuple = ("driver", "down", "up", *range(1, 62))
SETTLED_AFTER = 16           # orders that all agree on both peaks and the OOM end the trial there
MAX_REPLAYED = 40_000_000    # events replayed for the orders of one plan: a longer capture tries fewer orders


@dataclass
class Plan:
    peak_allocated: int = 0
    peak_reserved: int = 0
    fragmentation_at_peak: int = 0
    categories: dict = field(default_factory=dict)   # bytes per category at the peak allocated
    oom: dict | None = None
    entries: int = 0
    partial: bool = False
    error: str | None = None
    workspace: int = 0
    capture: object = field(default=None, repr=False)   # the Capture it replayed (for storing it as a trace)
    # the same requests under every order of ADDRESS_ORDERS: (lowest, highest) peak, and how many ran out
    peak_allocated_range: tuple = (0, 0)
    peak_reserved_range: tuple = (0, 0)
    address_orders: int = 1
    oom_orders: int = 0
    answer_order: str | int = "driver"               # the order the answer's own replay placed segments by

    @property
    def address_sensitive(self) -> bool:
        """Whether where the driver puts segments moves a peak or decides an OOM."""
        return (self.peak_allocated_range[0] != self.peak_allocated_range[1]
                or self.peak_reserved_range[0] != self.peak_reserved_range[1]
                or 0 < self.oom_orders < self.address_orders)

    def as_dict(self) -> dict:
        return {"peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "peak_allocated_range": list(self.peak_allocated_range),
                "peak_reserved_range": list(self.peak_reserved_range),
                "address_orders": self.address_orders, "oom_orders": self.oom_orders,
                "address_sensitive": self.address_sensitive, "answer_address_order": self.answer_order,
                "driver_order_source": DRIVER_ORDER_SOURCE if self.answer_order == "driver" else None,
                "fragmentation_at_peak": self.fragmentation_at_peak, "categories": self.categories,
                "oom": self.oom, "entries": self.entries, "partial": self.partial, "error": self.error,
                "cublas_workspace": self.workspace, "unseen": UNSEEN, "outside_allocator": OUTSIDE_ALLOCATOR,
                "unmeasured_workspaces": dict(getattr(self.capture, "unmeasured", None) or {})}


def settings_from(alloc_conf: str | None = None, total: int | None = None, cap: str | None = None) \
        -> AllocatorSettings:
    """Settings from a PYTORCH_CUDA_ALLOC_CONF string ("expandable_segments:True,max_split_size_mb:128")."""
    items = {}
    for part in (alloc_conf or "").split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition(":")
        if not sep:
            raise UserError(f"--alloc-conf wants KEY:VALUE[,KEY:VALUE...], got {part.strip()!r}")
        items[key.strip()] = value.strip()
    try:
        base = AllocatorSettings(device_total=total) if total else AllocatorSettings()
        return apply_overrides(base, items, cap)
    except ValueError as e:
        raise UserError(f"--alloc-conf: {e}") from None


def _largest_free(model: CachingAllocator) -> int:
    return max((key[1] for pool in (model.small, model.large) for key in pool.blocks), default=0)


def replay(cap: torch_capture.Capture, settings: AllocatorSettings, total: int | None = None,
           segments: list[tuple[int, int]] = (), orders: tuple = ADDRESS_ORDERS) -> Plan:
    """The capture's requests through the model; stops at the first OOM (the program would die there).

    `segments`: (address, size) of the segments a real run of the step got from cudaMalloc, in order. Best fit
    breaks ties between equal free blocks by address, and the driver's address for a new segment depends on
    what the process mapped before, which a plan cannot see: the answer is the replay with new segments where
    the driver was seen to put them (`orders[0]`), with the range of peaks and the OOMs over the orders of
    `orders` tried: all of them, unless the first SETTLED_AFTER agree (or the capture is too long to replay them
    all)."""
    plan = replay_once(cap, settings, total, segments, orders[0] if orders else "driver")
    n = max(1, min(len(orders), MAX_REPLAYED // max(1, len(cap.events))))
    every = [plan]
    for o in orders[1:n]:
        if len(every) == SETTLED_AFTER and len({(p.peak_allocated, p.peak_reserved, p.oom is None)
                                                for p in every}) == 1:
            break                            # the addresses do not move this step's answer
        every.append(replay_once(cap, settings, total, segments, o))
    plan.peak_allocated_range = (min(p.peak_allocated for p in every), max(p.peak_allocated for p in every))
    plan.peak_reserved_range = (min(p.peak_reserved for p in every), max(p.peak_reserved for p in every))
    plan.address_orders, plan.oom_orders = len(every), sum(p.oom is not None for p in every)
    return plan


def replay_once(cap: torch_capture.Capture, settings: AllocatorSettings, total: int | None,
                segments: list[tuple[int, int]], order: str | int) -> Plan:
    """One replay, new segments placed by `order` (SimulatedDevice) where `segments` names no address."""
    device = SimulatedDevice(total if total else settings.device_total, segments, order)
    model = CachingAllocator(settings, device, record=False)
    plan = Plan(partial=cap.partial, error=cap.error, workspace=cap.workspace, capture=cap, answer_order=order)
    live: dict = {}
    by_cat: dict = {c: 0 for c in torch_capture.CATEGORIES}
    malloc, free, category = model.malloc, model.free, cap.category   # the loop runs 64 times a point
    peak_allocated = peak_reserved = 0
    i = -1
    for i, e in enumerate(cap.events):
        if e.kind == "free":
            got = live.pop(e.key, None)
            if got is not None:
                by_cat[got[1]] -= got[0].size
                free(got[0])
            continue
        try:
            block = malloc(e.size, e.stream)
        except OutOfMemory as oom:
            plan.oom = {"event": i, "request": e.size, "op": e.op,
                        "site": torch_capture.user_site(e.frames),
                        "largest_free": _largest_free(model), "reserved": model.reserved,
                        "allocated": model.allocated, "cap": settings.memory_limit,
                        "total": total if total else settings.device_total, "alloc_size": oom.alloc_size}
            break
        cat = category.get(e.key, "other")
        live[e.key] = (block, cat)
        by_cat[cat] += block.size
        if model.allocated > peak_allocated:
            peak_allocated = model.allocated
            plan.categories = {c: b for c, b in by_cat.items() if b}
        if model.reserved > peak_reserved:
            peak_reserved = model.reserved
            plan.fragmentation_at_peak = model.reserved - model.allocated
    plan.peak_allocated, plan.peak_reserved, plan.entries = peak_allocated, peak_reserved, i + 1
    plan.peak_allocated_range = (plan.peak_allocated, plan.peak_allocated)
    plan.peak_reserved_range = (plan.peak_reserved, plan.peak_reserved)
    plan.oom_orders = int(plan.oom is not None)
    return plan


class PlanRun:
    """What `with plan(...) as p:` yields: `p.capture` while the body runs, `p.result` (a Plan) after."""

    def __init__(self, settings: AllocatorSettings, total: int | None):
        self.settings, self.total = settings, total
        self.capture: torch_capture.Capture | None = None
        self.result: Plan | None = None


@contextlib.contextmanager
def plan(*, device: str = "cuda:0", total: str | int | None = None, alloc_conf: str | None = None,
         cap: str | None = None):
    """Run the body (a training step building its model on `device`) on fake tensors; `result` afterwards."""
    if not str(device).startswith("cuda"):
        raise UserError(f"plan models CUDA devices, got {device!r}")
    total_b = parse_size(total) if isinstance(total, str) else total
    run = PlanRun(settings_from(alloc_conf, total_b, cap), total_b)
    with torch_capture.capture() as c:
        run.capture = c
        yield run
    run.result = replay(c, run.settings, total_b)


def capture_callable(fn, *args, measured=None, **kwargs) -> torch_capture.Capture:
    """`fn(*args, **kwargs)` run on fake CUDA tensors: its requests, as `replay` takes them. `measured`: each op's
    own allocations recorded on a GPU per op signature (torch_scratch.measured_table)."""
    with torch_capture.capture(measured=measured) as c:
        fn(*args, **kwargs)
    if not any(e.kind == "alloc" for e in c.events) and not c.partial:
        raise UserError("the program never allocated on a CUDA device (build the model and inputs on 'cuda')")
    return c


def plan_callable(fn, *args, settings: AllocatorSettings | None = None, total: int | None = None,
                  measured=None, orders: tuple = ADDRESS_ORDERS, **kwargs) -> Plan:
    """`fn(*args, **kwargs)` captured (capture_callable) and replayed under `settings` (a card of `total`);
    `orders`: the segment address orders tried (replay)."""
    return replay(capture_callable(fn, *args, measured=measured, **kwargs), settings or AllocatorSettings(), total,
                  orders=orders)


def parse_range(text: str) -> tuple[str, int, int]:
    """"batch=8..512" -> ("batch", 8, 512)."""
    name, sep, rng = str(text).partition("=")
    lo, dots, hi = rng.partition("..")
    if not sep or not name.strip().isidentifier() or not dots or not lo.strip().isdecimal() \
            or not hi.strip().isdecimal():
        raise UserError(f"--vary wants NAME=LO..HI (e.g. batch=8..512), got {text!r}")
    lo_i, hi_i = int(lo), int(hi)
    if not 1 <= lo_i <= hi_i or hi_i > 1 << 40:
        raise UserError(f"--vary: the range {lo_i}..{hi_i} is empty or not positive")
    return name.strip(), lo_i, hi_i


def largest_fitting(point, lo: int, hi: int, budget: int, settings: AllocatorSettings,
                    keep: dict | None = None) -> dict:
    """Bisect for the largest value in lo..hi whose step runs under `budget` bytes (the allocator's cap: it
    releases its cache and retries before an OOM, as the real one does). `point(value, settings)` -> the step
    at that value: its Capture (capture_callable), or a Plan already replayed under `settings`. Returns value
    (None when even `lo` fails), the points tried and a growth law per category; `keep` (a dict) receives each
    point's Plan by value, so a caller can store them.

    Given captures, the search replays the answer's address order at every point and every order only where
    the answer needs them (at the answer, one step above it, and the search for the value every order fits):
    each point's `address_orders` says how many it replayed."""
    capped = replace(settings, memory_limit=budget)
    tried: dict[int, Plan] = {}
    captured: dict = {}                      # captures not yet replayed in every address order

    def run(v: int, every_order: bool = False) -> Plan:
        if v not in tried:
            if len(tried) >= MAX_SEARCH:
                raise UserError(f"the search tried {MAX_SEARCH} points without an answer")
            got = point(v, capped)
            if isinstance(got, Plan):
                tried[v] = got
            else:
                captured[v] = got
                tried[v] = replay(got, capped, orders=ADDRESS_ORDERS[:1])
            if tried[v].partial:
                raise UserError(f"at {v}: {tried[v].error}")
        if every_order and v in captured:
            tried[v] = replay(captured.pop(v), capped)
        return tried[v]

    value = _bisect(lo, hi, lambda v: run(v).oom is None)
    if value is not None:                    # address_certainty reads every order here and one step above
        run(value, True)
        if value != hi:
            run(value + 1, True)
    # the answer wherever the driver puts segments: below it, the largest value every address order runs
    every = value if value is None or run(value).oom_orders == 0 else \
        _bisect(lo, value, lambda v: run(v, True).oom_orders == 0)
    if value is None:
        run(lo, True)
    if keep is not None:
        keep.update(tried)
    points = [{"value": v, "fits": p.oom is None, **p.as_dict()} for v, p in sorted(tried.items())]
    return {"value": value, "value_every_order": every, "budget": budget, "points": points,
            "laws": growth_laws(points), "address_orders": address_certainty(tried, value, lo, hi)}


def _bisect(lo: int, hi: int, fits) -> int | None:
    """The largest v in lo..hi with fits(v), for a fits that holds up to some value and not after."""
    if not fits(lo):
        return None
    if fits(hi):
        return hi
    good, bad = lo, hi
    while good + 1 < bad:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def address_certainty(tried: dict, value: int | None, lo: int, hi: int) -> dict:
    """Whether the answer holds wherever the driver puts segments: of the address orders replayed at the answer,
    how many run out of memory, and of those one step above it, how many fit (the search always tried value + 1,
    or `lo` when nothing fits)."""
    at = tried[value] if value is not None else None
    above = tried[lo] if value is None else (tried[value + 1] if value != hi else None)
    out = {"orders_at_value": at.address_orders if at else 0, "oom_at_value": at.oom_orders if at else None,
           "orders_above_value": above.address_orders if above else 0,
           "fit_above_value": above.address_orders - above.oom_orders if above else 0}
    out["certain"] = not out["oom_at_value"] and out["fit_above_value"] == 0
    return out


def growth_laws(points: list[dict]) -> dict:
    """Per category, bytes at the peak = a + b·value when that line holds for every point run to its end."""
    full = [p for p in points if p["oom"] is None]
    out = {}
    for cat in torch_capture.CATEGORIES:
        xs = [(p["value"], p["categories"].get(cat, 0)) for p in full]
        if len(xs) < 2:
            continue
        (x0, y0), (x1, y1) = xs[0], xs[-1]
        if x1 == x0:
            continue
        b = (y1 - y0) / (x1 - x0)
        a = y0 - b * x0
        exact = all(abs(a + b * x - y) <= max(1.0, 0.01 * y) for x, y in xs)
        out[cat] = {"a": round(a), "b_per_unit": round(b), "linear": exact}
    return out


def script_argv(program: list[str]) -> list[str]:
    """`python train.py ARGS` or `train.py ARGS` -> [train.py, ARGS...]; the script runs in this process."""
    words = list(program)
    if words[:1] == ["--"]:
        words = words[1:]
    if words and (words[0].rsplit("/", 1)[-1].startswith("python")):
        words = words[1:]
    if not words or not words[0].endswith(".py"):
        raise UserError("plan runs a Python training script: alloctrace plan -- python train.py ARGS")
    return words


def run_script(argv: list[str], settings: AllocatorSettings, total: int | None = None) -> Plan:
    """Run the script (as `python argv...` would, `__name__ == "__main__"`) on fake CUDA tensors, replayed."""
    return replay(capture_script(argv), settings, total)


def capture_script(argv: list[str]) -> torch_capture.Capture:
    """The script run as `python argv...` would run it (`__name__ == "__main__"`), on fake CUDA tensors."""
    import os
    import runpy
    import sys

    if not os.path.isfile(argv[0]):
        raise UserError(f"no such script: {argv[0]}")
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    try:
        return capture_callable(runpy.run_path, argv[0], run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def vary_script(argv: list[str], name: str, lo: int, hi: int, budget: int, settings: AllocatorSettings,
                keep: dict | None = None) -> dict:
    """`largest_fitting` over the script with `{name}` in its arguments replaced by each value tried; `keep`
    gets each value's Plan (its capture, to store the search's runs)."""
    marker = "{" + name + "}"
    if not any(marker in a for a in argv):
        raise UserError(f"--vary {name}: the program's arguments have no {marker} to replace")
    out = largest_fitting(lambda v, s: capture_script([a.replace(marker, str(v)) for a in argv]),
                          lo, hi, budget, settings, keep)
    out["lo"], out["hi"] = lo, hi
    return out
