"""How long diff_graphs takes on two synthetic 1M-event graphs (goal: under 1 s).

The graphs are event streams of a layered network (per layer: a few activations
allocated, used and freed, as in a transformer block) with real best-fit
choices from the model's free-block allocator. Three pairs are timed:
identical runs, runs that part in the middle (one tensor grows), and runs of
unrelated tensor names; each as lists of Event and as the store's columns.
Wall and CPU time are printed: on a shared machine the CPU time is the fairer number.
Usage: python bench/bench_diff.py [n_events]
"""
from __future__ import annotations

import random
import sys
import time

from alloctrace.allocator import Event, get_profile
from alloctrace.allocator.tallocr import LegacyTallocr
from alloctrace.traces.store.columns import encode, public_columns
from alloctrace.traces.diff.graphs import diff_graphs
from figures import Figure, at_most, take_option, write

FIGURES: list[Figure] = []

SIZES = [2048, 4096, 1024, 8192, 2048, 512]


def synthetic_events(n_events: int, grow_at: int | None = None, prefix: str = "", seed: int = 1) -> list:
    """alloc/exec/free/step events until n_events; tensor `grow_at` (a node number) is made 4x larger."""
    rng = random.Random(seed)
    t = LegacyTallocr.new_measure(get_profile("ggml-2023-08-16"), 16)
    events: list = []
    live: list = []
    node = 0
    while len(events) < n_events:
        size = rng.choice(SIZES) * (4 if node == grow_at else 1)
        name = f"{prefix}n{node % 97}"
        choice = t.alloc(size)
        events.append(Event("alloc", tensor=name, size=size, block=choice.block, addr=choice.addr,
                            offset=choice.addr - t.base, node=node))
        events.append(Event("exec", tensor=name, op="MUL_MAT", node=node))
        live.append((name, choice.addr, size))
        while len(live) > 3 or (live and rng.random() < 0.3):
            victim = live.pop(rng.randrange(len(live)))
            t.free(victim[1], victim[2])
            events.append(Event("free", tensor=victim[0], size=victim[2], addr=victim[1], offset=victim[1] - t.base))
        events.append(Event("step", node=node))
        node += 1
    return events


def as_columns(events: list) -> dict:
    """What `Store.columns` hands to diff_refs for a stored graph."""
    cols, table = encode(events)
    return public_columns(len(events), cols, table)


def timed(label: str, a, b):
    t0, c0 = time.perf_counter(), time.process_time()
    d = diff_graphs(a, b, {"label": "a"}, {"label": "b"})
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    fd = d.first_divergence
    where = f"first divergence at event {fd['event_a']}" if fd else "no divergence"
    print(f"  {label:<24} {dt:6.3f} s wall {dc:6.3f} s cpu  aligned {d.aligned['fraction']:.3f}, {where}")
    n = len(a["i"]) if isinstance(a, dict) else len(a)
    FIGURES.append(at_most(f"diff: {label}, {n:,} events", dt, "s", 1, f"CPU {dc:.3f} s"))


def main():
    json_path = take_option(sys.argv)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    t0 = time.perf_counter()
    base = synthetic_events(n)
    mid = synthetic_events(n, grow_at=len(base) // 8)
    other = synthetic_events(n, prefix="x", seed=7)
    print(f"built 3 graphs of {len(base)} events in {time.perf_counter() - t0:.1f} s")
    print("event lists (diff_graphs on list[Event]):")
    timed("identical", base, list(base))
    timed("parting in the middle", base, mid)
    timed("unrelated names", base, other)
    base_c, mid_c, other_c = as_columns(base), as_columns(mid), as_columns(other)
    print("store columns (diff_refs path, Store.columns):")
    timed("identical", base_c, base_c)
    timed("parting in the middle", base_c, mid_c)
    timed("unrelated names", base_c, other_c)
    for f, where in zip(FIGURES, ["event lists"] * 3 + ["store columns"] * 3):
        f.figure = f.figure.replace("diff: ", f"diff ({where}): ")
    write(json_path, FIGURES)


if __name__ == "__main__":
    main()
