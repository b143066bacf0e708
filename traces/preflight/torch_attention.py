"""scaled_dot_product_attention as the GPU runs it: the fused kernel it picks, and that kernel's own allocations.

On a GPU, `F.scaled_dot_product_attention` asks the CUDA build which kernel to run; a CPU build of PyTorch has
no such choice for fake CUDA tensors and falls back to the math path, which keeps a [query, key] matrix per
head (and an fp32 copy of bf16 inputs). The plan would then see far more memory than the GPU takes. During a
capture, `fused_kernels` calls the fused op the GPU calls instead, so autograd saves what the
kernel saves and its backward is the kernel's backward; `program` gives each such op's allocations in the
order the GPU made them, scratch included (and a boolean mask made a float one, as the GPU's path makes it).

What the GPU picks and what each kernel allocates were recorded on an H200 with PyTorch 2.11.0+cu130 and cuDNN
9.19 (bench/record_torch_plan_truths.py --sdpa-kernels -> tests/data/torch/plan/sdpa_kernels.json: 12 shapes,
three dtypes, causal or not, packed or separate q/k/v; every one of the 270 ops matches `program`): fp16 and bf16
run cuDNN's attention, fp32 the memory-efficient kernel; with dropout, boolean or float masks and grouped-query
attention too (--sdpa-options -> sdpa_options.json), except fp32 with fewer key heads, which runs the math path.
Other GPUs and versions pick otherwise (an A100 has no cuDNN attention by default): docs/torch-plan.md,
"Limits". A call the recordings did not cover (a head dim above 256, a mask that needs its gradient) keeps the
math path.
"""
from __future__ import annotations

import contextlib

CUDNN, EFFICIENT = "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention"
OPS = (CUDNN, EFFICIENT, CUDNN + "_backward", EFFICIENT + "_backward")
CUDNN_FORWARD_WORKSPACE = 256          # bytes cuDNN's forward takes and gives back, every recorded shape


def _align(x: int, to: int) -> int:
    return -(-x // to) * to


def kernel_for(q, k, v, attn_mask, dropout_p: float, enable_gqa: bool) -> str | None:
    """The fused op the GPU runs for these inputs, or None where it runs the math path or the recording does
    not say (then the math path is kept)."""
    import torch

    if not all(t.dim() == 4 for t in (q, k, v)) or not q.dtype == k.dtype == v.dtype:
        return None
    if q.size(-1) != v.size(-1) or q.size(-1) > 256 or k.size(1) != v.size(1):
        return None
    if attn_mask is not None and (attn_mask.requires_grad or attn_mask.dim() not in (2, 4)):
        return None
    gqa = q.size(1) != k.size(1)
    if gqa and (not enable_gqa or q.size(1) % k.size(1)):
        return None
    if q.dtype in (torch.float16, torch.bfloat16):
        return CUDNN
    return EFFICIENT if q.dtype == torch.float32 and not gqa else None   # fp32 with fewer key heads: math


def _float_mask(mask, dtype):
    """A boolean mask as the float one the fused kernels take (0 where attended, -inf where not)."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.scalar_tensor(float("-inf"), dtype=dtype, device=mask.device))


def _bias_for_efficient(mask, q, k):
    """The memory-efficient kernel's bias: its last dim padded to a multiple of 8 (then viewed back), expanded to
    [batch, heads, query, key] (a view)."""
    import torch.nn.functional as F

    pad = -mask.size(-1) % 8
    if pad:
        mask = F.pad(mask, (0, pad))[..., :mask.size(-1)]
    return mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))


def fused_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """F.scaled_dot_product_attention by the fused op the GPU would run; None when it would not run one."""
    import torch

    if torch.is_autocast_enabled("cuda"):            # the autocast kernel casts the three inputs first
        low = torch.get_autocast_dtype("cuda")
        query, key, value = (t.to(low) if t.is_floating_point() and t.dtype != low else t
                             for t in (query, key, value))
    op = kernel_for(query, key, value, attn_mask, dropout_p, enable_gqa)
    if op is None:
        return None
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    with torch.autocast("cuda", enabled=False):
        mask = _float_mask(attn_mask, query.dtype)
        if op == CUDNN:
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, mask, lse, dropout_p, is_causal, False, scale=scale)[0]
        if mask is not None:
            mask = _bias_for_efficient(mask, query, key)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, mask, lse, dropout_p, is_causal, scale=scale)[0]


@contextlib.contextmanager
def fused_kernels():
    """scaled_dot_product_attention through `fused_attention` while the body runs, wherever it is called from:
    `torch.nn.functional`'s attribute is replaced (what user code and nn.MultiheadAttention, from inside torch,
    call), and a torch function mode catches references taken before (a mode sees only calls made outside
    another override, so it alone would miss nn.MultiheadAttention's)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    original = F.scaled_dot_product_attention
    targets = {original, torch._C._nn.scaled_dot_product_attention}

    def scaled_dot_product_attention(*args, **kwargs):
        out = fused_attention(*args, **kwargs)
        return original(*args, **kwargs) if out is None else out

    class Kernels(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in targets:
                return scaled_dot_product_attention(*args, **kwargs)
            return func(*args, **kwargs)

    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        with Kernels():
            yield
    finally:
        F.scaled_dot_product_attention = original


def program(name: str, args: tuple, out) -> tuple[list, list] | None:
    """For a fused attention op: (its output tensors in the order the GPU allocated them, its steps as
    torch_scratch programs read: ("out", _) the next output, ("alloc", bytes) scratch, ("free", i) the i-th
    scratch given back). None for any other op."""
    if name not in OPS:
        return None
    import torch

    if name == CUDNN:                    # philox seed and offset first (8 bytes each on the GPU), output, lse
        return [out[6], out[7], out[0], out[1]], [("out", 0)] * 4 + [("alloc", CUDNN_FORWARD_WORKSPACE),
                                                                       ("free", 0)]
    if name == EFFICIENT:                # the output and the logsumexp (seed and offset stay off the GPU)
        return [out[0], out[1]], [("out", 0), ("out", 0)]
    grad_out, q = args[0], args[1]
    b, h, t, d = q.shape
    if name == CUDNN + "_backward":      # dq, dk, dv, then one workspace: an fp32 dq and row statistics, and
        key = args[2]                    # with fewer key/value heads dk and dv for every query head
        wide = 2 * b * h * key.size(2) * d * key.element_size() if key.size(1) != h else 0
        return list(out[:3]), [("out", 0)] * 3 + [("alloc", 4 * b * h * t * d + 4 * b * h * t + 256 + wide),
                                                  ("free", 0)]
    # memory-efficient backward: grad_out made contiguous in [b, t, h, d] when it is not, the gradients, an
    # fp32 copy and two row vectors (two given back before the kernel's workspace is taken), the workspace
    steps = []
    if not grad_out.transpose(1, 2).is_contiguous():
        steps.append(("alloc", grad_out.numel() * grad_out.element_size()))
    block, per_block = (64, 4) if d <= 64 else (128, 8) if d <= 128 else (64, 8)
    rows = _align(t, block)
    workspace = 4 * b * h * (rows * _align(d, 64) + rows // block * per_block)
    steps += [("out", 0)] * 3 + [("alloc", 4 * b * h * t * d), ("alloc", 4 * b * h * t), ("alloc", 4 * b * h * t),
                                 ("free", 0), ("free", 1), ("alloc", workspace)]
    scratch = sum(s[0] == "alloc" for s in steps)
    steps += [("free", i) for i in range(2, scratch)]
    return [x for x in out[:3] if isinstance(x, torch.Tensor)], steps
