"""Scratch that CUDA kernels take from the caching allocator and fake tensors do not show.

A fake tensor's meta function makes the op's outputs only; some CUDA kernels also allocate (and free) through
the caching allocator inside the op. The ones a training step meets are modelled here, each from PyTorch's CUDA
source and checked against snapshots recorded on an H200 (torch 2.11, tests/data/torch/plan/):

- reductions (`sum`, `mean`) that split one output's inputs over several thread blocks: a staging buffer and
  one semaphore per output block column, allocated after the output and freed before the op returns
  (`setReduceConfig` in ATen's Reduce.cuh: the grid follows the GPU's multiprocessor count);
- `embedding` / `embedding_dense_backward` with non-contiguous indices: the indices made contiguous first;
- `_softmax_backward_data`: a second buffer of the gradient's size, freed at once.

Some scratch cannot be worked out on a CPU (cuDNN picks a convolution algorithm, and its workspace, on the
device): `measured_table` reads what a GPU run recorded per op signature, the order of the op's outputs and
workspaces; a capture given that table replays them in that order, the workspaces in their own category
("measured_workspace") so the exact part of a plan stays apart.

`scratch(name, args, out)` answers ([(bytes, before_output)], ...) for one op: sizes to allocate around its
output, in order, each freed when the op returns.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

REDUCTIONS = ("sum", "mean")
MAX_VALUES_PER_THREAD = 256
MIN_VALUES_PER_THREAD = 16


@dataclass(frozen=True)
class Gpu:
    """What the kernels' launch configuration reads from the device."""
    multiprocessors: int = 132            # H100 / H200 SXM
    max_threads_per_multiprocessor: int = 2048
    warp: int = 32


def _last_pow2(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _reduced_dims(shape: tuple, dims) -> list[int]:
    nd = len(shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(nd))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % nd for d in dims}) if nd else []


def reduce_scratch(shape: tuple, dims, acc_bytes: int, gpu: Gpu = Gpu()) -> list[int]:
    """The global-reduce buffer and semaphores of a reduction of a contiguous tensor (bytes), or []."""
    shape = tuple(int(s) for s in shape)
    red = _reduced_dims(shape, dims)
    numel = 1
    for s in shape:
        numel *= s
    kept = [s for i, s in enumerate(shape) if i not in red and s != 1]
    num_outputs = 1
    for s in kept:
        num_outputs *= s
    if numel == 0 or num_outputs == 0:
        return []
    inputs_per_output = numel // num_outputs
    if inputs_per_output <= 1:
        return []
    live = [i for i, s in enumerate(shape) if s != 1]
    on_fastest = not kept or live[-1] in red
    groups = 0                                 # reduced dims after adjacent ones are coalesced
    prev = None
    for i in live:
        if i in red and (prev is None or prev not in red):
            groups += 1
        prev = i
    out_vec = 1
    if on_fastest:
        dim0, dim1 = inputs_per_output, num_outputs
        if dim0 > 128 and groups == 1:          # vectorised loads of 4 inputs
            dim0 //= 4
    else:
        dim0, dim1 = num_outputs, inputs_per_output
        inner = 1                              # the kept dims below the innermost reduced one
        for i in reversed(live):
            if i in red:
                break
            inner *= shape[i]
        out_vec = 4
        while inner % out_vec:
            out_vec //= 2
        dim0 //= out_vec
    max_threads = 512 // out_vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    block_w = min(d0, gpu.warp)
    block_h = min(d1, max_threads // block_w)
    block_w = min(d0, max_threads // block_h)
    threads = block_w * block_h
    step_in, step_out = 1, 1
    block_x_reduce = False
    if on_fastest:
        step_in *= block_w
        block_x_reduce = True
    else:
        step_out *= block_w
    split_y = False
    if _div_up(inputs_per_output, step_in) >= block_h * 16 or \
            _div_up(inputs_per_output, step_in) >= MAX_VALUES_PER_THREAD:
        step_in *= block_h
        split_y = True
    else:
        step_out *= block_h
    grid_x = _div_up(num_outputs // out_vec, step_out)
    values = _div_up(inputs_per_output, step_in)
    target = gpu.multiprocessors * (gpu.max_threads_per_multiprocessor // threads)
    ctas = 1
    if split_y and values >= MAX_VALUES_PER_THREAD and grid_x <= target:
        ctas = max(min(_div_up(target, grid_x), _div_up(values, MIN_VALUES_PER_THREAD)),
                   _div_up(values, MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return []
    size = acc_bytes * num_outputs * ctas
    if not block_x_reduce:
        size *= block_w * out_vec
    return [size, 4 * grid_x]


def scratch(name: str, args: tuple, out, gpu: Gpu = Gpu()) -> tuple[list[int], list[int]]:
    """(sizes allocated before the op's output, sizes allocated after it); all freed when the op returns."""
    import torch
    if name in REDUCTIONS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda":
        x = args[0]
        if not x.is_contiguous() or not x.dtype.is_floating_point:
            return [], []
        dims = args[1] if len(args) > 1 else None
        acc = 8 if x.dtype == torch.float64 else 4
        return [], reduce_scratch(tuple(x.shape), dims, acc, gpu)
    if name == "embedding" and len(args) > 1:
        idx = args[1]
        if idx.dim() > 1 and not idx.is_contiguous():
            return [idx.numel() * idx.element_size()], []
    if name == "embedding_dense_backward" and len(args) > 1:
        idx = args[1]
        if not idx.is_contiguous():
            return [idx.numel() * idx.element_size()], []
    if name == "_softmax_backward_data" and isinstance(out, torch.Tensor):
        return [], [out.untyped_storage().nbytes()]
    if name == "native_layer_norm_backward" and args and isinstance(args[0], torch.Tensor) \
            and not args[0].is_contiguous():
        # the kernel makes the incoming gradient contiguous after allocating its outputs (nn.MultiheadAttention
        # with batch_first hands a transposed one back to the norm before it: H200 op-labelled sequences)
        return [], [args[0].numel() * args[0].element_size()]
    return [], []


def op_signature(op: str, args) -> str:
    """An op and its arguments as `record_torch_plan_truths.py --more` keys its measured scratch: the overload's
    name, then each tensor argument's dtype[shape] and each scalar argument, in order."""
    import torch
    from torch.utils._pytree import tree_leaves
    parts = [op]
    for a in tree_leaves(args):
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}")
        elif isinstance(a, (int, float, bool)) or a is None:
            parts.append(repr(a))
    return " ".join(parts)


@dataclass
class Measured:
    """Per op signature, the order of an op's own allocations recorded on a GPU (`record_torch_plan_truths.py
    --scratch`): [["out", size] | ["alloc", size] | ["free", i]], "out" the blocks it keeps (its outputs, in
    order), "alloc" the ones it gives back before returning (the i-th such is freed at ["free", i])."""
    exact: dict                 # signature -> program
    by_template: dict           # signature with some leading dims as "N" -> {batch: program}
    ops: frozenset = frozenset()    # the op names recorded

    def program(self, signature: str) -> list | None:
        """The recorded program; at a batch not recorded, one made from the nearest recorded batches."""
        if signature.split(" ", 1)[0] not in self.ops:
            return None
        if signature in self.exact:
            return self.exact[signature]
        best = None
        for batch, template in _templates(signature):
            got = self.by_template.get(template)
            if got and (best is None or len(got) > len(best[1])):
                best = (batch, got)
        return None if best is None else between(best[1], best[0])


def measured_table(recorded: dict) -> Measured:
    """A `--scratch` recording's runs ({"batch", "ops": {signature: [program, ...]}}) as a lookup table: what
    cuDNN's convolutions took and gave back inside the call on the GPU that recorded them, which a CPU cannot
    work out. A signature called with different programs keeps its first."""
    exact: dict = {}
    by_template: dict = {}
    for run in recorded.get("runs", []):
        for signature, programs in run.get("ops", {}).items():
            exact.setdefault(signature, programs[0])
            for batch, template in _templates(signature):
                if batch == run["batch"]:
                    by_template.setdefault(template, {}).setdefault(batch, programs[0])
    return Measured(exact, by_template, frozenset(s.split(" ", 1)[0] for s in exact))


MAX_SPOTS = 4                   # more tensors of one leading dim: all of them or none are the batch
TENSOR = re.compile(r"([a-z0-9]+)\[(\d+)((?:, \d+)*)\]")


def _templates(signature: str):
    """(batch, template) for each choice of tensors whose leading dim is the batch: every nonempty subset of
    the tensors sharing one leading dim (a weight's out-channels can equal the batch)."""
    found = list(TENSOR.finditer(signature))
    for lead in sorted({int(m.group(2)) for m in found}):
        spots = [m for m in found if int(m.group(2)) == lead]
        masks = range(1, 1 << len(spots)) if len(spots) <= MAX_SPOTS else [(1 << len(spots)) - 1]
        for mask in masks:
            text, last = [], 0
            for k, m in enumerate(spots):
                if mask >> k & 1:
                    text.append(signature[last:m.start(2)] + "N")
                    last = m.end(2)
            yield lead, "".join(text) + signature[last:]


def _steps(program: list) -> list:
    return [(k, v if k == "free" else None) for k, v in program]


def between(recorded: dict, batch: int) -> list:
    """A program at `batch` from those recorded at other batches: each "alloc" interpolated (or carried on)
    linearly from the two nearest recorded batches around it whose programs take the same steps; where they
    differ (cuDNN picked another algorithm in between), the nearer one's program, per sample scaled."""
    below = [b for b in recorded if b < batch]
    above = [b for b in recorded if b > batch]
    pairs = []
    if below and above:
        pairs.append((max(below), min(above)))
    if len(below) >= 2:
        b = sorted(below)
        pairs.append((b[-2], b[-1]))
    if len(above) >= 2:
        a = sorted(above)
        pairs.append((a[0], a[1]))
    for b0, b1 in pairs[:1] if below and above else pairs:
        p0, p1 = recorded[b0], recorded[b1]
        if _steps(p0) == _steps(p1):
            out = []
            for (k, v0), (_, v1) in zip(p0, p1):
                if k == "alloc":
                    v = v0 + (v1 - v0) * (batch - b0) / (b1 - b0)
                    out.append([k, max(1, round(v))])
                else:
                    out.append([k, v0])
            return out
    near = min(recorded, key=lambda b: (abs(b - batch), -b))
    return [[k, -(-v * batch // near)] if k == "alloc" else [k, v] for k, v in recorded[near]]
