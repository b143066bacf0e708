"""Backward on fake CUDA tensors without a GPU: the autograd engine's order, run from Python.

PyTorch's engine asks the CUDA driver for its streams' contexts before a backward touches a CUDA tensor
(`GraphTask::stash_current_streams`), which fails on a machine without a GPU even when every tensor is fake.
This module walks the graph itself, in the order the engine does on one device: a ready queue that runs the
node with the highest sequence number first (gradient accumulation into leaves first of all), each node run
once all the gradients flowing into it are summed, its input gradients dropped right after it ran, then its
saved tensors released (unless the graph is retained), then its outputs handed on.

Saved tensors are held through `saved_tensors_hooks` (`SavedTensors`), so that releasing a node's saved
tensors after it ran, as the engine does, frees them here too. A program's own hooks (non-reentrant
checkpointing's among them) are lent the same way: what they packed, and the hooks themselves, are held through
a `Lent` that is emptied when its node has run. The engine's `release_variables` drops a saved variable's hooks
with it; a checkpointed region's frame (its saved inputs with it) lives only as long as those hooks.
"""
from __future__ import annotations

import contextlib
import heapq
import os
import sys
import weakref

import torch

ACCUMULATE = "AccumulateGrad"
CHECKPOINT_FILE = os.path.join("torch", "utils", "checkpoint.py")


class Holder:
    """A saved tensor as a node holds it; `tensor` is dropped when the node has run."""
    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


class HookPair:
    """A program's (pack, unpack) saved-tensor hooks, held by its `Lent`s once the pair is off the stack."""
    __slots__ = ("pack", "unpack", "__weakref__")

    def __init__(self, pack, unpack):
        self.pack, self.unpack = pack, unpack


class Lent:
    """What a program's pack hook returned, as one saved variable holds it; emptied when its node has run."""
    __slots__ = ("value", "pair")

    def __init__(self, value, pair: HookPair):
        self.value, self.pair = value, pair


class LentPack:
    """The pack function pushed in place of a program's: it reaches the program's hooks through a weak
    reference, so that a saved variable keeps them alive only through its `Lent`. Attributes the program set
    on its pack function (checkpointing reads its own marks back from the stack) are read through."""
    __slots__ = ("pair",)

    def __init__(self, pair: HookPair):
        self.pair = weakref.ref(pair)

    def __call__(self, tensor):
        pair = self.pair()
        return Lent(pair.pack(tensor), pair)

    def __getattr__(self, name):
        pair = object.__getattribute__(self, "pair")()
        if pair is None:
            raise AttributeError(name)
        return getattr(pair.pack, name)


class SavedTensors:
    """Pack/unpack hooks that record which holders a node unpacks, so they can be released after it ran."""

    def __init__(self, on_pack=None):
        self.unpacked: list | None = None
        self.on_pack = on_pack
        self.pairs: list = []                # the hooks stack as pushed: a HookPair, or None for ours

    def pack(self, tensor):
        if self.on_pack is not None:
            self.on_pack(tensor)
        return Holder(tensor)

    def unpack(self, holder: Holder):
        if self.unpacked is not None and not _inside_recomputation():
            self.unpacked.append(holder)
        if holder.tensor is None:
            raise RuntimeError("a saved tensor was used after its node ran: a second backward without "
                               "retain_graph=True")
        return holder.tensor

    def unpack_lent(self, lent: Lent):
        if self.unpacked is not None and not _inside_recomputation():
            self.unpacked.append(lent)
        if lent.pair is None:
            raise RuntimeError("a saved tensor was used after its node ran: a second backward without "
                               "retain_graph=True")
        return lent.pair.unpack(lent.value)

    @contextlib.contextmanager
    def hooks(self):
        """Our hooks outermost, and every pair the program pushes inside lent through `LentPack`."""
        autograd = torch._C._autograd
        push, pop = autograd._push_saved_tensors_default_hooks, autograd._pop_saved_tensors_default_hooks

        def pushed(pack, unpack):
            if pack == self.pack:
                self.pairs.append(None)
                return push(pack, unpack)
            pair = HookPair(pack, unpack)
            self.pairs.append(pair)
            return push(LentPack(pair), self.unpack_lent)

        def popped():
            if self.pairs:
                self.pairs.pop()
            return pop()

        autograd._push_saved_tensors_default_hooks, autograd._pop_saved_tensors_default_hooks = pushed, popped
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            autograd._push_saved_tensors_default_hooks, autograd._pop_saved_tensors_default_hooks = push, pop


def _inside_recomputation() -> bool:
    """Non-reentrant checkpointing reads its frame's saved inputs while recomputing for another node: those
    belong to the checkpoint's own input node, and are released when that node runs, not this one."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return False
        if frame.f_code.co_name == "get_inputs" and frame.f_code.co_filename.endswith(CHECKPOINT_FILE):
            return True
        frame = frame.f_back
    return False


def _outputs_of(node, result) -> list:
    """The node's gradients, one per edge in `next_functions`. A custom Function's backward returns one per
    argument of its forward, non-tensor ones included (None there), while its node has an edge per tensor
    argument only: the engine keeps those (PyNode, `is_variable_input`). The tensors that need a gradient are
    the edges that lead somewhere, in order; a tensor that needs none has an empty edge."""
    outputs = [result] if isinstance(result, torch.Tensor) or result is None else list(result)
    edges = node.next_functions
    needs = getattr(node, "needs_input_grad", None)
    if len(outputs) == len(edges) or needs is None or len(needs) != len(outputs):
        return outputs
    wanted = iter([grad for grad, need in zip(outputs, needs) if need])
    return [None if nxt is None else next(wanted, None) for nxt, _ in edges]


def _accumulate_into_leaf(var: torch.Tensor, grad: torch.Tensor, on_grad):
    """What AccumulateGrad does with a gradient nobody else holds: steal it, or add it in place."""
    with torch.no_grad():
        if var.grad is None:
            if grad.stride() == var.stride() or grad.numel() <= 1:
                var.grad = grad.detach()
            else:
                var.grad = torch.empty_strided(var.size(), var.stride(), dtype=var.dtype,
                                               device=var.device).copy_(grad)
            on_grad(var.grad)
        else:
            var.grad.add_(grad)
    for hook in getattr(var, "_post_accumulate_grad_hooks", None) or {}:
        hooks = var._post_accumulate_grad_hooks
        hooks[hook](var)


def _references(buffer: list, pos: int) -> tuple[int, int]:
    """(Python references to the buffered gradient, users of its storage), counted the same way each time."""
    return sys.getrefcount(buffer[pos]), torch._C._storage_Use_Count(buffer[pos].untyped_storage()._cdata)


_SOLE: list = []      # what `_references` answers for a tensor only a buffer holds (measured once)


def _held_only_here(buffer: list, pos: int) -> bool:
    """The engine's can_accumulate_inplace: the buffer holds the last reference to the gradient and to its
    storage (no view, no caller, no other buffer shares it), and its layout is dense."""
    if not _SOLE:
        _SOLE.extend(_references([torch.empty(1)], 0))
    refs, users = _references(buffer, pos)
    return refs <= _SOLE[0] and users <= _SOLE[1] and buffer[pos].is_contiguous()


def _sum_into(buffer: list, pos: int, grad):
    """InputBuffer::accumulate: added in place into the gradient already there when nothing else holds it,
    else summed into a new tensor (a gradient the caller still holds, or one shared by two inputs)."""
    if grad is None:
        return
    if buffer[pos] is None:
        buffer[pos] = grad
    elif _held_only_here(buffer, pos):
        with torch.no_grad():
            buffer[pos].add_(grad)
    else:
        with torch.no_grad():
            buffer[pos] = buffer[pos] + grad


def _validated(nxt, pos: int, grad):
    """validate_outputs: a gradient is summed to its input's shape and cast to its dtype."""
    if grad is None:
        return None
    meta = getattr(nxt, "_input_metadata", None)
    if meta is None or pos >= len(meta):
        return grad
    m = meta[pos]
    shape = tuple(m.shape)
    if tuple(grad.shape) != shape:
        grad = grad.sum_to_size(shape)
    if grad.dtype != m.dtype:
        grad = grad.to(m.dtype)
    return grad


def _num_inputs(node) -> int:
    meta = getattr(node, "_input_metadata", None)
    return len(meta) if meta is not None else 1


def run_backward(saved: SavedTensors, roots, grads, *, retain_graph: bool = False, on_grad=lambda g: None):
    """Backward from `roots` (tensors) with `grads` (their gradients), accumulating into leaves' `.grad`.
    Grad mode is off while nodes run, as in the engine (no graph of the backward itself is recorded)."""
    with torch.no_grad():
        _run_backward(saved, list(roots), list(grads), retain_graph, on_grad)


def _run_backward(saved: SavedTensors, roots, grads, retain_graph: bool, on_grad):
    deps: dict = {}
    start = []
    for t in roots:
        if t.grad_fn is not None:
            start.append(t.grad_fn)
    seen, stack = set(), list(start)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for nxt, _ in node.next_functions:
            if nxt is not None:
                deps[nxt] = deps.get(nxt, 0) + 1
                if nxt not in seen:
                    stack.append(nxt)
    buffers: dict = {}
    ready: list = []
    order = 0
    for t, g in zip(roots, grads):
        node = t.grad_fn
        if node is None:
            if t.requires_grad:
                _accumulate_into_leaf(t, g, on_grad)
            continue
        buf = buffers.setdefault(node, [None] * _num_inputs(node))
        _sum_into(buf, t.output_nr, g)
    for node in buffers:
        if deps.get(node, 0) == 0:
            order += 1
            heapq.heappush(ready, (-node._sequence_nr(), order, node))
    del grads, roots
    while ready:
        _, _, node = heapq.heappop(ready)
        for nxt in _run_node(saved, node, buffers, deps, retain_graph, on_grad):
            order += 1
            heapq.heappush(ready, (-nxt._sequence_nr(), order, nxt))
        del node


def _run_node(saved: SavedTensors, node, buffers: dict, deps: dict, retain_graph: bool, on_grad) -> list:
    """Run one node as the engine's evaluate_function does; returns the nodes that became ready. Everything
    it holds is dropped when it returns (the order of frees is the engine's: inputs, saved tensors)."""
    inputs = buffers.pop(node)
    if type(node).__name__ == ACCUMULATE:
        if inputs[0] is not None:
            _accumulate_into_leaf(node.variable, inputs[0], on_grad)
        return []
    outer, saved.unpacked = saved.unpacked, []     # a reentrant checkpoint runs a backward inside a node
    try:
        # a custom Function's node (reentrant checkpointing's among them) is run through `apply`
        result = node(*inputs) if callable(node) else node.apply(*inputs)
    finally:
        used, saved.unpacked = saved.unpacked, outer
    # validate_outputs runs inside the call, before the inputs and saved tensors go
    outputs = [None if nxt is None else _validated(nxt, pos, grad)
               for (nxt, pos), grad in zip(node.next_functions, _outputs_of(node, result))]
    del result
    inputs.clear()
    if not retain_graph:
        for holder in used:
            if isinstance(holder, Lent):
                holder.value = holder.pair = None
            else:
                holder.tensor = None
    used.clear()
    ready = []
    for i, (nxt, pos) in enumerate(node.next_functions):
        if nxt is None:
            continue
        buf = buffers.get(nxt)
        if buf is None:
            buf = buffers[nxt] = [None] * _num_inputs(nxt)
        _sum_into(buf, pos, outputs[i])
        outputs[i] = None
        deps[nxt] -= 1
        if deps[nxt] == 0:
            ready.append(nxt)
    return ready
