"""The Python face of `alloctrace plan`: a PyTorch step's CUDA memory predicted on a CPU.

    import alloctrace.torch
    with alloctrace.torch.plan(device="cuda:0", total="80GiB") as p:
        step()                           # builds its model on "cuda"; runs on fake tensors
    p.result.peak_reserved, p.result.oom

It only names what traces/preflight/torch_plan.py does (docs/torch-plan.md).
"""
from __future__ import annotations

from alloctrace.traces.preflight.torch_plan import (Plan, capture_callable, largest_fitting, plan, plan_callable,
                                                   settings_from)

__all__ = ["Plan", "capture_callable", "largest_fitting", "plan", "plan_callable", "settings_from"]
