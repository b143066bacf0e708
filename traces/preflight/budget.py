"""`alloctrace fit`: the largest value of one flag whose run fits a memory budget, by bisection over dry runs.

A probe's bytes are its exact compute buffers (all buffer types) plus, unless told to count compute only, the
weights, every KV cache and the output buffers the program printed (rounded, as printed). The answer and the
value one step above are checked against the program's own breakdown (breakdown.py). Probes run into a scratch
store; the answer is run once more into the real store, so it can be opened, diffed and shown.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass

from alloctrace.traces.errors import UserError

from .breakdown import check
from .points import DEFAULT_RETRY_HUNG, DEFAULT_TIMEOUT, Point, run_points
from .printed import bytes_of, total_mib
from .vary import Vary

MAX_PROBES = 64


def parse_budget(text: str) -> int:
    """"8GiB" or "8G" -> 8589934592; "500MB" -> 500000000; "4096" -> 4096 bytes (util/sizes.parse_size)."""
    from alloctrace.traces.util.sizes import parse_size

    try:
        return parse_size(text or "")
    except ValueError as e:
        raise UserError(f"--budget wants a size such as 8GiB, 512MiB or 4096 (bytes): {e}") from None


@dataclass
class Probe:
    value: int
    point: Point
    total: int


def probe_total(p: Point, compute_only: bool) -> int:
    extra = 0 if compute_only else bytes_of(total_mib(p.printed))
    return p.total + extra


def fit(store, argv: list[str], flag: str, lo: int, hi: int, budget: int, library, *, step: int = 1,
        compute_only: bool = False, jobs: int | None = None, progress=None,
        timeout: float | None = DEFAULT_TIMEOUT, retry_hung: int = DEFAULT_RETRY_HUNG) -> dict:
    """The largest value in lo..hi (a multiple of `step` above lo) whose total fits `budget`, assuming the
    total grows with the value; every probe's value and total are in the answer. A run that hung at `timeout`
    is run again, up to `retry_hung` times (run_points)."""
    limits = {"timeout": timeout, "retry_hung": retry_hung}
    if step < 1:
        raise UserError("--step must be at least 1")
    probes: list[Probe] = []
    seen: dict[int, Probe] = {}

    with tempfile.TemporaryDirectory(prefix="alloctrace-fit-") as scratch:
        from alloctrace.traces.store.store import open_store

        tmp_store = open_store(scratch)

        def run(v: int) -> Probe:
            if v in seen:
                return seen[v]
            if len(probes) >= MAX_PROBES:
                raise UserError(f"fit: more than {MAX_PROBES} probes; narrow the range or raise --step")
            _sid, (p,) = run_points(tmp_store, argv, [Vary(flag, (str(v),))], library, jobs=1, **limits)
            if p.error or not p.buffers:
                raise UserError(f"fit: the run with {flag} {v} failed: {p.error or 'no compute buffer was made'}")
            pr = seen[v] = Probe(v, p, probe_total(p, compute_only))
            probes.append(pr)
            if progress:
                progress(pr)
            return pr

        first = run(lo)
        if first.total > budget:
            return _answer(store, argv, (flag, lo, hi, step), budget, None, first, probes, library, compute_only,
                           limits)
        top = lo + (hi - lo) // step * step
        last = run(top)
        if last.total <= budget:
            return _answer(store, argv, (flag, lo, hi, step), budget, last, None, probes, library, compute_only,
                           limits)
        good, bad = first, last  # good fits, bad does not; bisect on the step grid
        while (bad.value - good.value) > step:
            mid = good.value + ((bad.value - good.value) // step // 2) * step
            pr = run(mid)
            if pr.total <= budget:
                good = pr
            else:
                bad = pr
        if good.total > bad.total:
            raise UserError(f"fit: the total shrinks from {flag} {good.value} to {bad.value}: it does not grow "
                            "with the value, so bisection cannot answer; use sweep")
        return _answer(store, argv, (flag, lo, hi, step), budget, good, bad, probes, library, compute_only,
                       limits)


def _answer(store, argv, span, budget, good: Probe | None, bad: Probe | None, probes, library, compute_only,
            limits: dict) -> dict:
    flag, lo, hi, step = span
    best, sid = None, None
    if good is not None:  # once more into the real store: the answer is a trace like any other
        # with every probe's sizes, so the pre-flight page draws the whole search, not one point
        kept = {"flag": flag, "lo": lo, "hi": hi, "step": step, "budget": budget, "compute_only": compute_only,
                "value": good.value, "probes": [{"value": p.value, "total": p.total, "fits": p.total <= budget,
                                                 "buffers": p.point.buffers, "printed": p.point.printed}
                                                for p in probes]}
        sid, (best,) = run_points(store, argv, [Vary(flag, (str(good.value),))], library, jobs=1, **limits,
                                  tags=(f"fit={flag}", f"budget={budget}"), extra={"fit": kept})
    return {"flag": flag, "budget": budget, "compute_only": compute_only,
            "value": good.value if good else None, "total": good.total if good else None,
            "point": best.to_json() if best else None, "sweep": sid,
            "check": check(best.buffers, best.printed) if best else None,
            "next": {"value": bad.value, "total": bad.total, "buffers": bad.point.buffers,
                     "printed": bad.point.printed, "check": check(bad.point.buffers, bad.point.printed)}
            if bad else None,
            "probes": [{"value": p.value, "total": p.total, "fits": p.total <= budget, "retried": p.point.retried}
                       for p in probes],
            "ignored": sorted({f for p in probes for f in p.point.ignored})}
