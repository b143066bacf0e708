"""Why a buffer has its size: what is live at its high-water mark, by family and call site.

Owns: `peak` (ggml_peak, graph_peak, peak_json, GraphPeak, size_attribution, graphs_attribution: a ggml
graph's peak and the size change between two runs, over store columns), `peak_types` (its numpy-free parts:
GraphPeak, Live, Moment, families, size_attribution), `peak_fast` (peak_of_events: the same peak from a list of
Events in plain Python, for a sweep's workers), `peak_shapes` (a peak's tensors: shape, type, a name
for the unnamed), `torch_peak` (peak, by_call_site, oom_card: a PyTorch
device's peak by call site and the card of an out-of-memory), `torch_flame` + `torch_flame_svg` (a device's
memory as a flamegraph, and its SVG), `run_overview` (run_overview, high_water: every graph of a long run
at a glance, for the dashboard's run chart).
"""
