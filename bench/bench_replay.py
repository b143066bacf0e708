"""Time `alloctrace replay` on LLaMA-2 70B (n_ctx 512, n_batch 512, Metal order): goal under 0.5 s.

Prints the split between graph building, the concurrency list and the two allocator walks,
so a slow run says where the time goes.
"""
from __future__ import annotations

import statistics
import sys
import time

from alloctrace.allocator.layout import LAYOUTS
from alloctrace.allocator.legacy import LegacyAllocator
from alloctrace.allocator.presets import family_of, get_preset
from alloctrace.allocator.presets.space import AddressSpace
from alloctrace.allocator.profiles import get_profile
from alloctrace.traces.replay.run import replay
from alloctrace.metal_exec import find_concurrency
from figures import at_most, take_option, write

REPEAT = 5


def split(profile_name: str) -> dict:
    preset, prof = get_preset("llama2-70b"), get_profile(profile_name)
    fam = family_of(preset)
    t = {}
    t0 = time.perf_counter()
    model = fam.new_model(preset.hparams, 512, profile_name)
    fam.place_model(model, LAYOUTS["macos-metal"], AddressSpace())
    t["model"] = time.perf_counter() - t0
    measure = LegacyAllocator.measure(prof, fam.ALIGNMENT)
    t0 = time.perf_counter()
    g = fam.build_graph(model, 512, 0, measure.alloc_tensor, profile_name)
    t["build graph"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    seq = find_concurrency(g)
    t["concurrency"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    measure.alloc_graph(g, parse_seq=seq)
    t["measure walk"] = time.perf_counter() - t0
    real = LegacyAllocator.real(prof, 0x2A0000000, measure.t.max_size + 32, fam.ALIGNMENT)
    g2 = fam.build_graph(model, 512, 0, real.alloc_tensor, profile_name)
    t0 = time.perf_counter()
    real.alloc_graph(g2, parse_seq=seq)
    t["eval walk"] = time.perf_counter() - t0
    try:
        from alloctrace.traces.diff.graphs import diff_graphs
    except ImportError:
        return t
    t0 = time.perf_counter()
    diff_graphs(measure.events, real.events)
    t["diff"] = time.perf_counter() - t0
    return t


def main():
    json_path = take_option(sys.argv)
    figures = []
    for profile in ("ggml-2023-08-16", "ggml-2023-08-28"):
        runs = []
        for _ in range(REPEAT):
            t0 = time.perf_counter()
            replay("llama2-70b", profile, n_ctx=512, n_batch=512, metal_concurrency=True)
            runs.append(time.perf_counter() - t0)
        print(f"llama2-70b 512/512 metal {profile}: replay (measure + eval + diff) "
              f"median {statistics.median(runs):.3f} s, min {min(runs):.3f} s over {REPEAT} runs")
        figures.append(at_most(f"replay: llama2-70b 512/512 metal {profile}, median of {REPEAT}",
                               statistics.median(runs), "s", 0.5))
        parts = split(profile)
        print("  " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in parts.items()))
    write(json_path, figures)


if __name__ == "__main__":
    main()
