"""The pre-flight page's curves (traces/preflight/curves.py) from points as a sweep or fit stores them: every
printed label of the kinds a budget counts drawn (an iSWA cache's own label; not the program's breakdown, a
check), the total as `fit` counts it, a law through rounded sizes within their printed rounding, and none where the sizes bend."""
from __future__ import annotations

from alloctrace.traces.preflight.budget import probe_total
from alloctrace.traces.preflight.curves import curves_of, printed_uncertainty
from alloctrace.traces.preflight.points import Point
from alloctrace.traces.preflight.printed import MIB

CTX = [512, 1024, 2048, 4096]


def row(c: int, printed: dict) -> dict:
    return {"values": {"-c": str(c), "-fa": "on"}, "buffers": {"CUDA0": 1000 * c + 4096, "CUDA_Host": 2048},
            "printed": printed, "trace": None}


def kv(c: int) -> dict:
    # an iSWA model: the full cache grows with -c, the sliding-window one stops at its window (1024 cells)
    return {"weights": {"CUDA0": 1250.0}, "kv_cache": {"CUDA0": round(c * 0.0625, 2), "CUDA0 (SWA)":
                                                       round(min(c, 1024) * 0.03125, 2)},
            "compute": {"CUDA0": 1.0}, "breakdown_self": {"CUDA0": 1300}, "projected": {"CUDA0": 1310}}


def test_every_printed_label_and_kind_is_a_curve_and_the_total_counts_as_fit_does():
    curves = curves_of([row(c, kv(c)) for c in CTX], "-c", "-fa=on")
    names = [c["name"] for c in curves]
    assert names == ["CUDA0 compute buffer (-fa=on)", "CUDA_Host compute buffer (-fa=on)", "CUDA0 weights (-fa=on)",
                     "CUDA0 KV cache (-fa=on)", "CUDA0 (SWA) KV cache (-fa=on)", "total (-fa=on)"]  # the breakdown: a check
    total = curves[-1]
    for c, p in zip(CTX, total["points"]):
        point = Point({}, [], buffers=row(c, kv(c))["buffers"], printed=kv(c))
        assert p["bytes"] == probe_total(point, compute_only=False)  # the same sum the bisection compares
    swa = curves[4]
    assert swa["law"] is None  # grows, then stops at its window: no straight line is claimed
    assert curves[3]["law"]["slope"] == 65536 and not curves[3]["law"]["exact"]
    assert curves[0]["law"] == {"intercept": 4096, "slope": 1000, "formula": "4,096 + 1,000·-c B", "exact": True,
                                "holds": "exact"}


def test_compute_only_draws_the_compute_buffers_alone():
    curves = curves_of([row(c, kv(c)) for c in CTX], "-c", compute_only=True)
    assert [c["kind"] for c in curves] == ["compute", "compute", "total"]
    assert [p["bytes"] for p in curves[-1]["points"]] == [1000 * c + 4096 + 2048 for c in CTX]
    assert all(p["uncertainty_bytes"] == 0 for p in curves[-1]["points"])


def test_a_line_through_rounded_sizes_is_found_within_their_rounding():
    # 2048·c bytes printed to two decimals: 0.125 MiB prints as 0.12 (5243 B off), the least-squares line misses
    printed = {c: {"kv_cache": {"CUDA0": round(2048 * c / MIB, 2)}} for c in (64, 128, 192, 256, 512)}
    curves = curves_of([row(c, printed[c]) for c in printed], "-c", span=(64, 512, 64))
    kv_curve = next(c for c in curves if c["kind"] == "kv_cache")
    assert kv_curve["law"]["slope"] == 2048 and kv_curve["law"]["intercept"] == 0
    assert all(abs(p["bytes"] - 2048 * p["x"]) <= p["uncertainty_bytes"] for p in kv_curve["points"])
    assert [p["x"] for p in kv_curve["predicted"]] == [320, 384, 448]  # the step grid, only where nothing ran
    assert printed_uncertainty([0.12, 0.25]) == 5243 and printed_uncertainty([40.0, 41.0]) == MIB // 2
