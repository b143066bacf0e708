"""What a plan does not follow, refused with one line that names it, instead of a wrong figure or a driver error.

- `torch.compile`: the compiled graph's kernels and their buffers are Inductor's, not the eager ops a capture sees.
- The recurrent layers (`nn.LSTM`, `nn.GRU`, `nn.RNN`) on a CUDA device: on a GPU the whole sequence is one call of
  cuDNN's RNN kernel, with a workspace and a reserve for backward sized by cuDNN at run time. Without a GPU a
  CUDA build of PyTorch stops in that kernel's setup with "CUDA driver version is insufficient", and a CPU build
  runs the step by step path instead, whose blocks the GPU never allocates. The cells (`nn.LSTMCell`, ...) run
  as their fused ops, which a capture sees as any other.

A refused call stops the capture there (`partial`), with the line and the user's call site (torch_capture).
"""
from __future__ import annotations

import contextlib

RNN_LAYERS = {"lstm": "nn.LSTM", "gru": "nn.GRU", "rnn_tanh": "nn.RNN", "rnn_relu": "nn.RNN"}


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise NotImplementedError(f"{what} is not followed by a plan (run the step without it)")
    return refused


def _rnn_on_cuda_refused(name: str, original):
    """torch._VF.<name> as nn.LSTM/GRU/RNN call it: refused for CUDA inputs, itself for the rest."""
    def rnn(*args, **kwargs):
        first = args[0] if args else None
        if getattr(getattr(first, "device", None), "type", None) == "cuda":
            raise NotImplementedError(f"{RNN_LAYERS[name]} on a CUDA device runs cuDNN's RNN kernel, whose "
                                      "workspace and reserve a plan does not follow yet")
        return original(*args, **kwargs)
    return rnn


@contextlib.contextmanager
def refused_paths():
    """torch.compile and the recurrent layers on CUDA refused while the body runs; put back after."""
    import torch
    import torch._VF as vf

    saved_compile = torch.compile
    own = {name: vf.__dict__[name] for name in RNN_LAYERS if name in vf.__dict__}
    torch.compile = _refuse("torch.compile")
    for name in RNN_LAYERS:
        setattr(vf, name, _rnn_on_cuda_refused(name, getattr(vf.vf, name)))
    try:
        yield
    finally:
        torch.compile = saved_compile
        for name in RNN_LAYERS:
            if name in own:
                setattr(vf, name, own[name])
            else:
                delattr(vf, name)
