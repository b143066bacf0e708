"""The driver's placement of new segments (allocator/cuda_driver_va.py), held to the addresses 58 fresh processes
got on an H200: 36 it was fitted to, 22 recorded after the fit (held_out_driver.json)."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from alloctrace.allocator.cuda_driver_va import CHUNK, PAGE, DriverAddresses

DATA = Path(__file__).resolve().parents[1] / "data" / "torch" / "plan"
MIB = 1 << 20


def _runs(*names):
    return [r for n in names for r in json.loads((DATA / n).read_text())["runs"]]


def test_small_segments_fill_the_first_range_upward_then_new_ranges_go_down():
    d = DriverAddresses(first_range=8 * MIB)
    a, b, c = d.place(2 * MIB), d.place(2 * MIB), d.place(6 * MIB)
    assert b == a + 2 * MIB                     # the lowest free address, upward
    assert c < a                                 # 6 MiB no longer fits: a new range below
    assert c % PAGE == 0 and a - c == CHUNK      # one 32 MiB reservation right below
    assert d.place(2 * MIB) == c + 6 * MIB       # its tail is lower than the first range's 4 MiB left
    assert d.place(24 * MIB) == c + 8 * MIB      # the rest of the tail, exactly
    assert d.place(4 * MIB) == a + 4 * MIB       # only the first range has room now
    assert d.free == []


def test_a_range_given_back_joins_its_neighbours_and_is_taken_again():
    d = DriverAddresses(first_range=0)
    a = d.place(10 * MIB)
    b = d.place(10 * MIB)
    assert b == a + 10 * MIB                     # the tail of the same 32 MiB reservation
    d.release(a, 10 * MIB)
    d.release(b, 10 * MIB)
    assert d.free == [(a, a + CHUNK)]            # one free range again, the whole reservation
    assert d.place(30 * MIB) == a
    d.release(1 << 40, 2 * MIB)                  # not one it handed out: nothing changes
    assert d.free == [(a + 30 * MIB, a + CHUNK)]


def _same_size_pairs_in_order(place_for_run, runs) -> float:
    agree = total = 0
    for run in runs:
        sizes = [size for _, size in run["segments"]]
        real = [addr for addr, _ in run["segments"]]
        place = place_for_run()
        model = [place(size) for size in sizes]
        for i in range(len(sizes)):
            for j in range(i + 1, len(sizes)):
                if sizes[i] == sizes[j]:         # best fit's tie-break compares these
                    total += 1
                    agree += (real[i] < real[j]) == (model[i] < model[j])
    return agree / total


def test_the_order_of_equal_segments_is_mostly_the_drivers_and_better_than_one_direction():
    """Pairs of equal-size segments in the real address order: driver 94.7 % over the 58 processes (94.5 % on
    the 22 recorded after the fit); all new segments below the older ones 72 %, all above 28 %."""
    every = _runs("segments.json", "held_out.json", "held_out_driver.json")
    after_fit = _runs("held_out_driver.json")
    driver = _same_size_pairs_in_order(lambda: DriverAddresses().place, every)

    def downward():
        below = itertools.count(0, -1)
        return lambda size: next(below)

    down = _same_size_pairs_in_order(downward, every)
    assert driver > 0.9 and down < 0.8 and driver > down
    assert _same_size_pairs_in_order(lambda: DriverAddresses().place, after_fit) > 0.9
