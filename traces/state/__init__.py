"""The allocator's state at any event of a trace, rebuilt from the events alone.

Owns: `free_list` (FreeList, Replay, state_at, free_summary, stranding: ggml's free list, the reference),
`free_list_fast` (apply_changes: the same changes with the work inlined, for scrubbing), `index` (StateIndex,
state_json, the checkpoints the store keeps: scrubbing a million-event graph), `torch_blocks`
(AllocatorState: a PyTorch device's segments and blocks), `torch_device` (Device, load_device, StateIndex,
state, entry: a stored PyTorch device as the views read it), `torch_frames` (call_site, site_label, parse_skip,
DEFAULT_SKIP: which frame of a stack is its call site), `torch_wrapped` (analyse, note: the allocator before
the first entry of a trace whose ring buffer wrapped).
"""
