"""Record a Python program's CUDA memory history from its start, for `alloctrace record`.

`alloctrace record` puts this file's directory first on the program's PYTHONPATH, so Python's
`site` imports it at startup. It imports nothing heavy: it waits for the program's own
`import torch`, then asks torch to call it back when the program itself first initialises CUDA
(torch's lazy-init queue), and switches the history on there, before the first CUDA tensor. So
the hook never initialises CUDA itself: settings and devices the program chooses after
`import torch` still apply, and forked DataLoader workers behave as without it. It dumps the snapshot once: at exit, on an uncaught OutOfMemoryError
and on SIGTERM. Then it runs the `sitecustomize` this one shadows, if there is one.

The environment says what to do: ALLOCTRACE_TORCH_DIR (where snapshots go; unset: nothing
happens), ALLOCTRACE_TORCH_STACKS (`python` or `all`), ALLOCTRACE_TORCH_MAX_ENTRIES.
Each process writes `[rankR-]pidP.pickle` (torch's own `_dump_snapshot`) and a `.json`
beside it saying why and when it dumped. This file uses the standard library only.
"""
import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import threading
import time

DIR_ENV, STACKS_ENV, ENTRIES_ENV = "ALLOCTRACE_TORCH_DIR", "ALLOCTRACE_TORCH_STACKS", "ALLOCTRACE_TORCH_MAX_ENTRIES"
LAUNCHERS = ("torchrun", os.path.join("distributed", "run.py"), os.path.join("distributed", "launch.py"))
HERE = os.path.dirname(os.path.abspath(__file__))


class Recorder:
    """One process's recording: on from `start(torch)`, dumped at most once."""

    def __init__(self, out_dir, stacks="python", max_entries=1_000_000):
        self.out_dir, self.stacks, self.max_entries = out_dir, stacks, max_entries
        self.torch = None
        self.pid = None
        self.dumped = None  # the reason of the dump, once made
        self.lock = threading.Lock()
        self.previous_term = None
        self.previous_excepthook = None

    def start(self, torch) -> bool:
        """Arm the recording for the program's first CUDA initialisation (not in a launcher such as torchrun).

        Nothing touches CUDA here: torch runs the queued call inside its own lazy init, which its first
        CUDA tensor, `torch.cuda.init()` or any device query triggers. So the program's later
        PYTORCH_CUDA_ALLOC_CONF and CUDA_VISIBLE_DEVICES still count, and forked workers of a program
        that has not used CUDA yet may use it themselves."""
        if is_launcher(sys.argv):
            return False
        lazy_call = getattr(torch.cuda, "_lazy_call", None)
        if lazy_call is None:  # a torch without lazy init: nothing to wait for
            self.on_cuda_init(torch)
        else:
            lazy_call(lambda: self.on_cuda_init(torch))
        return True

    def on_cuda_init(self, torch):
        """Switch the history on, right after CUDA initialised and before the first allocation; never raise
        (an exception here would fail the program's own CUDA init)."""
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=self.stacks,
                                                     max_entries=self.max_entries)
        except Exception as e:
            print(f"alloctrace: could not record CUDA memory history: {type(e).__name__}: {e}", file=sys.stderr)
            return
        self.torch, self.pid = torch, os.getpid()
        atexit.register(self.dump, "exit")
        self.previous_excepthook = sys.excepthook
        sys.excepthook = self.excepthook
        if threading.current_thread() is threading.main_thread():
            self.previous_term = signal.signal(signal.SIGTERM, self.on_sigterm)

    def excepthook(self, kind, value, tb):
        if isinstance(value, oom_errors(self.torch)):
            self.dump("oom")  # now: the exception's frames still hold the memory
        (self.previous_excepthook or sys.__excepthook__)(kind, value, tb)

    def on_sigterm(self, signum, frame):
        self.dump("sigterm")
        previous = self.previous_term
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def dump(self, reason: str):
        """Write the snapshot (once, and only in the process that started the recording, only if it saw memory)."""
        with self.lock:
            if self.dumped is not None or self.torch is None or os.getpid() != self.pid:
                return None
            self.dumped = reason
            memory = self.torch.cuda.memory
            snap = memory._snapshot()
            if not snap.get("segments") and not any(snap.get("device_traces") or []):
                return None  # CUDA was there but never used
            stem = os.path.join(self.out_dir, file_stem(os.environ, self.pid))
            memory._dump_snapshot(stem + ".pickle.part")
            os.replace(stem + ".pickle.part", stem + ".pickle")
            facts = {"reason": reason, "pid": self.pid, "argv": sys.argv, "time": time.time(),
                     "stacks": self.stacks, "max_entries": self.max_entries,
                     **{k.lower(): int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
                        if os.environ.get(k, "").isdecimal()}}
            with open(stem + ".json.part", "w") as f:
                json.dump(facts, f)
            os.replace(stem + ".json.part", stem + ".json")
            return stem + ".pickle"


def oom_errors(torch) -> tuple:
    found = tuple(e for e in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
                  if isinstance(e, type))
    return found or (MemoryError,)


def is_launcher(argv) -> bool:
    """torchrun and `python -m torch.distributed.run` start the workers; they allocate nothing themselves."""
    return bool(argv) and str(argv[0]).endswith(LAUNCHERS)


def file_stem(env, pid: int) -> str:
    rank = env.get("RANK", "")
    return f"rank{int(rank)}-pid{pid}" if rank.isdecimal() else f"pid{pid}"


class _AfterImport(importlib.abc.Loader):
    """Runs torch's own loader, then `then(module)`; the module keeps torch's loader as its own."""

    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def __getattr__(self, name):  # get_source, get_resource_reader, is_package ...: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then(module)


class WatchImport(importlib.abc.MetaPathFinder):
    """Finds `name` through the other finders and wraps its loader, once."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterImport(spec.loader, self.then)
                return spec
        return None


def install(env=None) -> "Recorder | None":
    env = os.environ if env is None else env
    out_dir = env.get(DIR_ENV)
    if not out_dir:
        return None
    entries = env.get(ENTRIES_ENV, "")
    rec = Recorder(out_dir, env.get(STACKS_ENV) or "python", int(entries) if entries.isdecimal() else 1_000_000)

    def started(torch):
        try:
            # a note for `record`: this process did import torch (so "nothing recorded" can say which part failed)
            open(os.path.join(out_dir, f"torch-imported-pid{os.getpid()}"), "w").close()
            rec.start(torch)
        except Exception as e:  # never break the program being recorded
            print(f"alloctrace: could not record CUDA memory history: {type(e).__name__}: {e}", file=sys.stderr)
    if env is os.environ and not is_launcher(sys.argv):
        forget_hook_env(env)
    if "torch" in sys.modules:
        started(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, WatchImport("torch", started))
    return rec


def forget_hook_env(env) -> None:
    """Take the hook out of the program's environment once it has loaded, so that no process the program
    starts (above all one it leaves running after its exit) records into the folder later. A launcher
    (torchrun) keeps it: its workers are the processes to record."""
    for name in [k for k in env if k.startswith("ALLOCTRACE_TORCH_")]:
        del env[name]
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != HERE]
    if rest:
        env["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        env.pop("PYTHONPATH", None)


def _run_shadowed_sitecustomize():
    """The `sitecustomize` that would have run without this directory on the path."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    sys.path[:] = rest
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    RECORDER = install()
    _run_shadowed_sitecustomize()
