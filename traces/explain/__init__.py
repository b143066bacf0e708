"""Why a buffer has its size: what is live at its high-water mark, by family and call site.

Owns: `peak` (ggml_peak, graph_peak, peak_json, GraphPeak, size_attribution, graphs_attribution: a ggml
graph's peak and the size change between two runs), `torch_peak` (peak, by_call_site, oom_card: a PyTorch
device's peak by call site and the card of an out-of-memory).
"""
