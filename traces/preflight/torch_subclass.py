"""Where a fake tensor, being a tensor subclass, would take another path than a CUDA tensor takes on the GPU.

ATen and torch.nn sometimes branch on "is this a tensor subclass": a plan that followed a fake tensor down those
branches would see blocks the GPU never allocates. Each case here was found in an op-labelled H200 sequence
(nn.TransformerEncoder with `batch_first`, docs/torch-plan.md "Attention"), and `as_plain_tensors` puts the
plain tensor's path back for the length of a capture:

- `copy.deepcopy`: Tensor.__deepcopy__ copies a subclass's attributes, a fake tensor's fake mode among them; the
  copy then belongs to another mode, and every later view of it is converted into this one as a new storage.
  On the GPU a deep copy is one clone per tensor and its views are views.
- `F.linear` on an input that is neither 2-D nor contiguous 3-D: ATen runs a matmul and adds the bias in place,
  out of place (a new block) only for tensor subclasses.
"""
from __future__ import annotations

import contextlib


def _deepcopy_in_this_mode(self, memo):
    """A clone (a new block, as on the GPU) that stays in the capture's fake mode."""
    import torch

    if id(self) in memo:
        return memo[id(self)]
    with torch.no_grad():
        new = self.clone(memory_format=torch.preserve_format)
    if isinstance(self, torch.nn.Parameter):
        new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
    elif self.requires_grad:
        new.requires_grad_(True)
    memo[id(self)] = new
    return new


@contextlib.contextmanager
def as_plain_tensors():
    """Fake tensors deep-copied and `F.linear` run as plain CUDA tensors are, while the body runs."""
    import torch
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensor

    original_linear = F.linear

    def linear(input, weight, bias=None):
        if bias is None or input.dim() == 2 or input.dim() == 3 and input.is_contiguous():
            return original_linear(input, weight, bias)
        if torch.is_autocast_enabled("cuda"):      # autocast's cached casts of weight and bias, kept as its
            original_linear(input.new_empty((0, input.size(-1))), weight, bias)   # linear keeps them (no rows)
        return original_linear(input, weight).add_(bias)

    F.linear = linear
    FakeTensor.__deepcopy__ = _deepcopy_in_this_mode
    try:
        yield
    finally:
        F.linear = original_linear
        del FakeTensor.__deepcopy__
