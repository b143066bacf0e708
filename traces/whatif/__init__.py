"""What a trace would have done under other allocator settings, replayed through a model.

Owns: `torch_model` (replay_check, what_if, compare_settings, trace_peaks: a PyTorch trace's requests through the
caching-allocator model of allocator/cuda_caching.py), `torch_request` (whatif_request, check_device,
apply_overrides, parse_size, infer_memory_limit: a request as the faces give it).
"""
