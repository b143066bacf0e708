"""traces/util/zstd.py: zstandard's compiled module loaded without the package's `__init__` (which imports
`typing` and `platform` on Python before 3.12) is the package's own module: the same classes once the
package is imported, the same bytes; and where it cannot be used alone the package is used instead."""
from __future__ import annotations

import os
import subprocess
import sys

import zstandard as package

from alloctrace.traces.util import zstd

# in a fresh interpreter: what the store's modules get and whether the package's __init__ ran; then the
# package, which must re-export the very classes already in use and make the same bytes
FRESH = """import sys
from alloctrace.traces.util.zstd import zstandard as alone
print(alone.__name__, "zstandard" in sys.modules)
data = bytes(range(256)) * 64
packed = alone.ZstdCompressor(level=3, write_checksum=True).compress(data)
import zstandard
assert zstandard.ZstdCompressor is alone.ZstdCompressor and zstandard.ZstdError is alone.ZstdError
assert zstandard.ZstdDecompressor().decompress(packed) == data
assert packed == zstandard.ZstdCompressor(level=3, write_checksum=True).compress(data)
print(alone.frame_content_size(packed))
"""


def fresh(env: dict) -> list[str]:
    run = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_the_compiled_module_alone_is_the_packages_own():
    assert fresh({}) == ["zstandard.backend_c", "False", str(256 * 64)]  # the package's __init__ never ran


def test_a_policy_other_than_the_default_gets_the_package():
    got = fresh({"PYTHON_ZSTANDARD_IMPORT_POLICY": "cffi_fallback"})
    assert got[:2] == ["zstandard", "True"]


def test_in_a_process_that_imported_the_package_it_is_the_package():
    assert "zstandard" in sys.modules and zstd.load() is package
    assert zstd.load().ZstdDecompressor is package.ZstdDecompressor
