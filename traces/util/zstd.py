"""`zstandard` for the modules that compress and read the store: its compiled module loaded by itself where
the package would pick that same module (CPython, the default or `cext` import policy), else `import
zstandard`.

The package's `__init__` only picks a backend and re-exports it, but on Python before 3.12 it imports
`typing` and `platform` to do so: about 5 ms of a short command's start (`alloctrace record`), more than
loading the compiled module itself. What this module hands out is the compiled module, whose classes are
the package's own (`import zstandard` later finds it in sys.modules and re-exports it); where it cannot be
loaded alone (another layout, another backend, any error), the package itself.
"""
from __future__ import annotations

import os
import sys

C_BACKEND = "zstandard.backend_c"
USED = ("ZstdCompressor", "ZstdDecompressor", "ZstdError", "frame_content_size")  # what this package calls


def _c_backend():
    """The package's compiled module, loaded as the package's `from .backend_c import *` would load it,
    without running the package's `__init__`; ImportError where that is not possible."""
    if C_BACKEND in sys.modules:
        return sys.modules[C_BACKEND]
    from importlib.machinery import ExtensionFileLoader, PathFinder
    from importlib.util import find_spec, module_from_spec

    package = find_spec("zstandard")  # a top-level name: found, not imported
    locations = package.submodule_search_locations if package is not None else None
    spec = PathFinder.find_spec(C_BACKEND, list(locations)) if locations else None
    if spec is None or not isinstance(spec.loader, ExtensionFileLoader):
        raise ImportError(f"no compiled {C_BACKEND} beside the package")
    module = module_from_spec(spec)
    sys.modules[C_BACKEND] = module
    try:
        spec.loader.exec_module(module)
        for name in USED:
            getattr(module, name)
    except BaseException:
        del sys.modules[C_BACKEND]
        raise
    return module


def load():
    """`zstandard` as the package's modules use it: the package when it is imported already (or asked for
    by PYTHON_ZSTANDARD_IMPORT_POLICY, or not CPython), else its compiled module alone."""
    if "zstandard" not in sys.modules and sys.implementation.name == "cpython" and \
            os.environ.get("PYTHON_ZSTANDARD_IMPORT_POLICY", "default").strip() in ("default", "cext"):
        try:
            return _c_backend()
        except (ImportError, OSError, AttributeError):
            pass
    import zstandard

    return zstandard


zstandard = load()
