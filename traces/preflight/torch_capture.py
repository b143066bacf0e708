"""Run a PyTorch training step on fake CUDA tensors and record every storage it allocates and frees.

No GPU, no weights: `FakeTensorMode` gives every tensor its shape, dtype and device without memory; a dispatch
mode above it sees each operation's outputs, notes each new CUDA storage (its size is what the caching
allocator would be asked for) and a weak reference tells when the storage dies. Backward runs through
torch_engine.py (PyTorch's own engine needs a GPU's context). Autocast on "cuda" is let through (its availability
check asks the driver). The first cuBLAS call on each thread allocates the handle's workspace through the
caching allocator; that one allocation is added as the real run makes it (its size: `CUBLAS_WORKSPACE_CONFIG`,
or PyTorch's default for the GPU's architecture).

Every event keeps the Python call site (the frames outside torch's own dispatch machinery), the op, dtype and
shape; a category is given when the run is over (parameters, gradients, optimizer state, activations saved for
backward, inputs, temporaries, workspace, other).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import weakref
from dataclasses import dataclass, field

from alloctrace.traces.errors import UserError
from alloctrace.traces.preflight import torch_attention, torch_refusals, torch_scratch, torch_subclass

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "inputs", "temporaries",
              "workspace", "other", "measured_workspace")
SM90_WORKSPACE = 4096 * 1024 * 8           # ":4096:8", PyTorch's default for Hopper and later
# ops whose CUDA kernel allocates its second output first (seen in the H200's op-labelled sequences)
MASK_FIRST = ("native_dropout",)
CONVOLUTIONS = ("convolution", "convolution_backward")
MATMULS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "_addmm_activation", "addbmm", "linear")
# frames of torch's dispatch machinery (and ours) say nothing about where a program asked for memory
HIDDEN = tuple(os.sep + os.path.join(*p.split("/")) for p in (
    "torch/_subclasses", "torch/utils/_python_dispatch", "torch/_ops.py", "torch/utils/_stats.py",
    "torch/_decomp", "torch/_refs", "torch/_prims", "torch/_dynamo", "contextlib.py", "runpy.py"))
_HIDDEN_FILES: dict = {}        # filename -> whether _frames leaves its frames out


def _installed_folders(*names: str) -> tuple:
    """The folders the packages `names` are installed in (one tree, or several with an editable install),
    without importing them. Frames are matched by these folders, not by a name: "torch/" or "alloctrace/"
    would hide a user's own files whenever they live under a folder of that name."""
    from importlib.util import find_spec

    folders = set()
    for name in names:
        spec = find_spec(name)
        folders.update(spec.submodule_search_locations or () if spec else ())
    return tuple(os.path.join(os.path.abspath(d), "") for d in folders)


TORCH_FOLDERS = _installed_folders("torch")


def user_site(frames: list) -> str:
    """The innermost frame outside torch: where the program asked for the memory."""
    for filename, line, name in frames:
        if not filename.startswith(TORCH_FOLDERS):
            return f"{filename}:{line} ({name})"
    return f"{frames[0][0]}:{frames[0][1]} ({frames[0][2]})" if frames else ""


# this package's rooms (a clone of this project elsewhere keeps its call sites)
_OURS = _installed_folders("alloctrace", "alloctrace.traces", "alloctrace.allocator", "alloctrace.metal_exec",
                           "alloctrace.server")


def workspace_size(config: str | None = None) -> int:
    """The cuBLAS workspace of one handle: ":SIZE_KiB:COUNT" pairs summed, as PyTorch reads the variable."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if config is None else config
    if not config:
        return SM90_WORKSPACE
    pairs = re.findall(r":(\d+):(\d+)", config)
    if not pairs:
        raise UserError(f"CUBLAS_WORKSPACE_CONFIG {config!r} is not ':SIZE:COUNT[:SIZE:COUNT...]'")
    return sum(int(s) * 1024 * int(n) for s, n in pairs)


def lt_workspace_size() -> int:
    """cuBLASLt's workspace (addmm with a bias vector): CUBLASLT_WORKSPACE_SIZE KiB, 1 MiB by default."""
    text = os.environ.get("CUBLASLT_WORKSPACE_SIZE", "1024").strip()
    if not text.isdecimal():
        raise UserError(f"CUBLASLT_WORKSPACE_SIZE {text!r} is not a whole number of KiB")
    return int(text) * 1024


@dataclass
class Event:
    kind: str                      # "alloc" | "free"
    key: int                       # one id per storage
    size: int
    stream: int = 0
    op: str = ""
    dtype: str = ""
    shape: tuple = ()
    frames: list = field(default_factory=list)   # (filename, line, name), innermost first
    phase: str = ""                # forward | backward | optimizer


@dataclass
class Capture:
    events: list = field(default_factory=list)
    category: dict = field(default_factory=dict)   # storage key -> category
    partial: bool = False
    error: str | None = None       # one line: the operation and the call site
    unmeasured: dict = field(default_factory=dict)   # op -> calls whose GPU scratch no measured table gave
    workspace: int = 0


def _frames(limit: int = 80) -> list:
    """The innermost `limit` frames, innermost first, less torch's dispatch machinery and ours. Walked by hand:
    `traceback.extract_stack` reads every frame's source line (a stat per frame), which a capture never uses."""
    out = []
    f = sys._getframe()
    hidden = _HIDDEN_FILES
    for _ in range(limit):
        if f is None:
            break
        code = f.f_code
        name = code.co_filename
        hide = hidden.get(name)
        if hide is None:
            hide = hidden[name] = name.startswith(_OURS) or any(h in name for h in HIDDEN)
        if not hide:
            out.append((name, f.f_lineno, code.co_name))
        f = f.f_back
    return out


class _Recorder:
    """The dispatch mode's body (kept apart so torch is imported only when a capture runs)."""

    def __init__(self, cap: Capture, workspace: int, measured=None):
        self.cap = cap
        self.measured = measured                  # torch_scratch.Measured: cuDNN's workspaces, recorded on a GPU
        self.live: dict[int, int] = {}            # storage key -> event key
        self.next_key = 1
        self.workspace = workspace
        self.handles: set = set()                 # "main" / "engine": cuBLAS handles that have their workspace
        self.lt_handles: set = set()              # the same for cuBLASLt
        self.lt_workspace = lt_workspace_size() if workspace else 0
        self.phase = "forward"

    def storage_key(self, t) -> int | None:
        st = t.untyped_storage()
        return self.live.get(st._cdata)

    def note(self, func, out, args=()):
        import torch
        from torch.utils._pytree import tree_leaves
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        if name == "_to_copy" and args and getattr(args[0], "device", None) is not None \
                and args[0].device.type == "cpu":
            name = "to_cuda"                        # a host tensor copied to the device: an input
        frames = None
        fused = torch_attention.program(name, args, out)    # the GPU's attention kernels: their own order
        program = self.measured.program(torch_scratch.op_signature(getattr(func, "__name__", str(func)), args)) \
            if self.measured and not fused else None
        before, after = ([], []) if program or fused else torch_scratch.scratch(name, args, out)
        if name in CONVOLUTIONS and not program and args and getattr(args[0], "device", None) is not None \
                and args[0].device.type == "cuda":      # cuDNN picks its workspace on the GPU, at run time
            self.cap.unmeasured[name] = self.cap.unmeasured.get(name, 0) + 1
        temps = [self._temp(size, name) for size in before]
        outputs = []
        leaves = fused[0] if fused else [out[1], out[0]] if name in MASK_FIRST else tree_leaves(out)
        for t in leaves:
            # a fused kernel's philox seed and offset are meta tensors to a fake run, 8 bytes each on the GPU
            if not isinstance(t, torch.Tensor) or t.device.type != "cuda" and not fused:
                continue
            st = t.untyped_storage()
            cdata = st._cdata
            if cdata in self.live or st.nbytes() == 0:      # a 0-byte request takes no block (a null pointer)
                continue
            key = self.next_key
            self.next_key += 1
            self.live[cdata] = key
            frames = _frames() if frames is None else frames
            outputs.append(Event("alloc", key, st.nbytes(), 0, name, str(t.dtype).replace("torch.", ""),
                                 tuple(t.shape), frames, self.phase))
            weakref.finalize(st, self._freed, cdata, key)
        if fused:
            self._measured_steps(fused[1], outputs, name, "temporaries", None)
        elif program:
            self._measured_steps(program, outputs, name)
        else:
            self.cap.events.extend(outputs)
        handle = "engine" if self.phase == "backward" else "main"   # the engine's device thread has its own
        empty = isinstance(out, torch.Tensor) and out.numel() == 0    # no rows: cuBLAS is never called
        if self.workspace and name in MATMULS and handle not in self.handles and not empty:
            self.handles.add(handle)
            key = self.next_key
            self.next_key += 1
            self.cap.category[key] = "workspace"
            self.cap.events.append(Event("alloc", key, self.workspace, 0, "cublas_workspace", "uint8",
                                         (self.workspace,), frames or _frames(), self.phase))
        if self.lt_workspace and name == "addmm" and handle not in self.lt_handles and len(args) > 0 and not empty \
                and getattr(args[0], "dim", lambda: 0)() == 1:
            self.lt_handles.add(handle)             # addmm with a bias vector: cuBLASLt, its own workspace
            key = self.next_key
            self.next_key += 1
            self.cap.category[key] = "workspace"
            self.cap.events.append(Event("alloc", key, self.lt_workspace, 0, "cublaslt_workspace", "uint8",
                                         (self.lt_workspace,), frames or _frames(), self.phase))

        temps += [self._temp(size, name) for size in after]
        for key in reversed(temps):
            self.cap.events.append(Event("free", key, 0))

    def _measured_steps(self, program: list, outputs: list, name: str, category: str = "measured_workspace",
                        label: str | None = "measured workspace"):
        """The op's outputs and the scratch recorded on a GPU in the order the GPU took them: each "out" step
        is the op's next output, "alloc" a measured block, "free" gives one back; outputs left over follow."""
        outputs = list(outputs)
        scratch: list[int] = []
        for step, value in program:
            if step == "out" and outputs:
                self.cap.events.append(outputs.pop(0))
            elif step == "alloc":
                key = self._temp(value, name if label is None else f"{name} ({label})")
                self.cap.category[key] = category
                scratch.append(key)
            elif step == "free" and value < len(scratch) and scratch[value]:
                self.cap.events.append(Event("free", scratch[value], 0))
                scratch[value] = 0
        self.cap.events.extend(outputs)
        for key in scratch:
            if key:
                self.cap.events.append(Event("free", key, 0))

    def _temp(self, size: int, op: str) -> int:
        key = self.next_key
        self.next_key += 1
        self.cap.category[key] = "temporaries"
        self.cap.events.append(Event("alloc", key, size, 0, f"{op} (kernel scratch)", "uint8", (size,),
                                     _frames(), self.phase))
        return key

    def _freed(self, cdata, key):
        if self.live.get(cdata) == key:
            del self.live[cdata]
        self.cap.events.append(Event("free", key, 0))

    def mark(self, t, category: str, overwrite: bool = False):
        if t is None:
            return
        key = self.storage_key(t)
        if key is not None and (overwrite or key not in self.cap.category):
            self.cap.category[key] = category


@contextlib.contextmanager
def _patched_cuda_checks():
    """Autocast on "cuda" asks the driver whether CUDA and bf16 are there; on a fake device they are."""
    import torch
    amp = torch.cuda.amp.common
    saved = (amp.amp_definitely_not_available, torch.cuda.is_bf16_supported)
    amp.amp_definitely_not_available = lambda: False
    torch.cuda.is_bf16_supported = lambda *a, **k: True
    try:
        yield
    finally:
        amp.amp_definitely_not_available, torch.cuda.is_bf16_supported = saved


def _failure_line(exc: BaseException) -> str:
    import traceback
    tb = traceback.extract_tb(exc.__traceback__)
    site = next((fs for fs in reversed(tb) if not fs.filename.startswith(_OURS)
                 and not fs.filename.startswith(TORCH_FOLDERS)), None)
    where = f" at {site.filename}:{site.lineno} ({site.name})" if site else ""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{type(exc).__name__}: {text[:200]}{where}"


@contextlib.contextmanager
def capture(*, workspace: int | None = None, measured=None):
    """Run the body on fake CUDA tensors; yields the `Capture` that fills in as it runs.

    A failure inside the body (an `.item()` on a fake, a data-dependent shape, a custom CUDA kernel) stops the
    run: the capture keeps what was recorded up to there, `partial` set and `error` naming the operation and
    the call site; the exception is not raised again. `measured` (torch_scratch.measured_table) adds the
    scratch recorded on a GPU where the GPU took it, in the category "measured_workspace"."""
    import torch
    import torch.utils.checkpoint
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from alloctrace.traces.preflight import torch_engine

    cap = Capture(workspace=workspace_size() if workspace is None else workspace)
    rec = _Recorder(cap, cap.workspace, measured)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            rec.note(func, out, args)
            return out

    saved = torch_engine.SavedTensors(on_pack=lambda t: rec.mark(t, "activations"))

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None, **_):
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        if grad_tensors is None or isinstance(grad_tensors, torch.Tensor):
            grad_tensors = (grad_tensors,) * len(tensors) if len(tensors) == 1 else (None,) * len(tensors)
        grads = [g if g is not None else torch.ones_like(t, memory_format=torch.preserve_format)
                 for t, g in zip(tensors, grad_tensors)]
        outer, rec.phase = rec.phase, "backward"     # a reentrant checkpoint's backward runs one inside
        tasks.append(len(tasks) + 1)
        try:
            torch_engine.run_backward(saved, tensors, grads, retain_graph=bool(retain_graph),
                                      on_grad=lambda g: rec.mark(g, "gradients", overwrite=True))
        finally:
            rec.phase = outer
            tasks.pop()

    # non-reentrant checkpointing keeps what it recomputed per graph task (the engine's id of one backward);
    # outside the engine's own backward the id is -1 and every saved tensor read would recompute afresh
    tasks: list[int] = []

    def graph_task_id():
        return tasks[-1] if tasks else -1

    def tensor_backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        backward(self, gradient, retain_graph, create_graph, inputs)

    def pre_step(opt, args, kwargs):
        rec.phase = "optimizer"
        for group in opt.param_groups:
            for p in group["params"]:
                rec.mark(p, "parameters", overwrite=True)
                rec.mark(p.grad, "gradients", overwrite=True)

    def post_step(opt, args, kwargs):
        rec.phase = "forward"
        for state in opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    rec.mark(v, "optimizer_state", overwrite=True)

    import torch.amp.grad_scaler as scaler_mod

    def opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        # GradScaler reads found_inf with .item() (a value fakes do not have): the step is taken, as it is
        # whenever the gradients are finite
        return optimizer.step(*args, **kwargs)

    saved_opt_step = scaler_mod.GradScaler._maybe_opt_step
    scaler_mod.GradScaler._maybe_opt_step = opt_step
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    # torch.optim picks its foreach (multi-tensor) path only for plain tensors; on a GPU it would take it
    from torch._subclasses.fake_tensor import FakeTensor
    import torch.optim.optimizer as optim_mod
    import torch.utils._foreach_utils as foreach_mod
    type_lists = [optim_mod._foreach_supported_types, foreach_mod._foreach_supported_types]
    for lst in type_lists:
        lst.append(FakeTensor)
    old = (torch.autograd.backward, torch.Tensor.backward, torch._C._current_graph_task_id)
    h1 = register_optimizer_step_pre_hook(pre_step)
    h2 = register_optimizer_step_post_hook(post_step)
    torch.autograd.backward, torch.Tensor.backward = backward, tensor_backward
    torch._C._current_graph_task_id = graph_task_id
    try:
        with _patched_cuda_checks(), fake, Mode(), saved.hooks(), torch_attention.fused_kernels(), \
                torch_subclass.as_plain_tensors(), torch_refusals.refused_paths():
            try:
                yield cap
            except (Exception, SystemExit) as exc:   # noqa: BLE001 - any failure of the user's step is reported
                if isinstance(exc, SystemExit) and not exc.code:
                    pass
                else:
                    cap.partial = True
                    cap.error = _failure_line(exc)
    finally:
        torch.autograd.backward, torch.Tensor.backward, torch._C._current_graph_task_id = old
        scaler_mod.GradScaler._maybe_opt_step = saved_opt_step
        for lst in type_lists:
            lst.remove(FakeTensor)
        h1.remove()
        h2.remove()
        _categorise(cap)


INPUT_OPS = ("randn", "randint", "rand", "randperm", "normal", "lift_fresh", "to_cuda")


def _categorise(cap: Capture):
    """Every storage gets a category: parameters, gradients and optimizer state as the optimizer's hooks saw
    them, inputs (random or copied from the host outside backward and the optimizer), activations (saved for
    backward), else optimizer state (made in the step and kept), temporaries (freed) or other."""
    freed = {e.key for e in cap.events if e.kind == "free"}
    for e in cap.events:
        if e.kind != "alloc":
            continue
        cat = cap.category.get(e.key)
        if e.phase == "forward" and e.op in INPUT_OPS and cat in (None, "activations"):
            cap.category[e.key] = "inputs"
        elif cat is not None:
            continue
        elif e.phase == "optimizer" and e.key not in freed:
            cap.category[e.key] = "optimizer_state"
        elif e.key in freed:
            cap.category[e.key] = "temporaries"
        else:
            cap.category[e.key] = "other"
