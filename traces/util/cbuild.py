"""Build a C source of this package into a shared library: at install time when a C compiler is there
(setup.py puts it beside its source), else on first use into a per-user cache; either way named by the
source's hash and the flags, so a library never outlives the source it was built from.

A library is code this process will run, so it is loaded only from a place no other user can write: the
folder and the file owned by this user (or root, for the install-time one) with no group or other write
bit, the file a regular one that holds the symbols it should. Anything else is never loaded: the library is
built again, into the cache when that is private, else into a fresh private folder (mkdtemp) that is
removed when the process ends. docs/limits.md lists these rules.

This module imports nothing of the package at its top: setup.py loads it by path to name what it builds."""
from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
from pathlib import Path


SHARED_FLAGS = ["-shared", "-fPIC", "-O2", "-fvisibility=hidden"]  # a plain library loaded with ctypes
RECORDER_FLAGS = SHARED_FLAGS + ["-D_GNU_SOURCE"]
RECORDER_LIBS = ("-ldl", "-lpthread")
# (source in the tree, stem, flags, libraries): built by setup.py beside the source; the recorder without
# --ggml-include needs no header of the program, so its default build is one of them
INSTALL_TIME = [("traces/sources/ggml_log/fastlog.c", "fastlog", SHARED_FLAGS, ()),
                ("traces/sources/record/replay_fast.c", "replay_fast", SHARED_FLAGS, ()),
                ("traces/sources/record/recorder.c", "recorder", RECORDER_FLAGS, RECORDER_LIBS)]
PRELOAD_UNSAFE = " :\t\n"  # the dynamic loader splits LD_PRELOAD at spaces and colons


def library_name(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"") -> str:
    """`<stem>-<hash>.so`: the hash of the source, `digest_extra` and the flags."""
    digest = sha256(source.read_bytes())
    digest.update(digest_extra)
    digest.update(" ".join(flags).encode())
    return f"{stem}-{digest.hexdigest()[:16]}.so"


def sha256(data: bytes):
    """hashlib.sha256 of `data`, from Python's own small module where it ships one: importing hashlib loads
    OpenSSL's libcrypto, which costs every sweep a few milliseconds before its first program. The same
    digest either way."""
    try:
        from _sha2 import sha256 as new  # Python 3.12 and later
    except ImportError:
        try:
            from _sha256 import sha256 as new  # Python 3.11
        except ImportError:
            from hashlib import sha256 as new
    return new(data)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "alloctrace"


def find_compiler() -> str | None:
    """The C compiler to use ($CC, else cc, gcc or clang), None when there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return cc if cc and shutil.which(cc) else None


def compiler(what: str) -> str:
    """find_compiler's, or a UserError naming `what` when there is none."""
    from alloctrace.traces.errors import UserError

    cc = find_compiler()
    if cc is None:
        raise UserError(f"no C compiler found to build {what} (cc, gcc or clang): install one "
                        "(e.g. apt install gcc) or set CC")
    return cc


def compile_library(cc: str, source: Path, out: Path, flags: list[str], libs: tuple = ()):
    """Run the compiler; its CompletedProcess (the library at `out` when it succeeded)."""
    import subprocess  # here: a library built before needs none

    return subprocess.run([cc, *flags, "-o", str(out), str(source), *libs], capture_output=True, text=True)


def private_dir(path: Path, owners: frozenset) -> bool:
    """A directory owned by one of `owners` that neither its group nor others can write."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid in owners and not st.st_mode & 0o022


def trusted_library(path: Path, owners: frozenset, symbols: tuple = ()) -> bool:
    """A regular file (not a link) owned by one of `owners`, not group or other writable, in a private
    folder, not empty, an ELF file whose dynamic symbol names include each of `symbols`."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners or st.st_mode & 0o022 or st.st_size == 0:
        return False
    if not private_dir(path.parent, owners):
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and all(b"\0" + s.encode() + b"\0" in data for s in symbols)


def preload_safe(path: Path) -> bool:
    """An absolute path the dynamic loader reads as one entry of LD_PRELOAD."""
    s = str(path)
    return os.path.isabs(s) and not any(c in s for c in PRELOAD_UNSAFE)


def build_library(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"", libs: tuple = (),
                  what: str | None = None, symbols: tuple = (), preload: bool = False) -> Path:
    """The path of `source` built as `<stem>-<hash>.so`: beside the source when it was built at install
    time, else in the private cache, else in a fresh private folder; compiled when no trusted copy is
    there. `digest_extra` is whatever else the build depends on (an included header's bytes); `symbols`
    are names the library must export; `preload`: the path must be safe in LD_PRELOAD."""
    from alloctrace.traces.errors import UserError

    what = what or stem
    name = library_name(source, stem, flags, digest_extra)
    me = frozenset({os.getuid()})
    fits = (lambda p: preload_safe(p)) if preload else (lambda p: True)
    beside = source.parent / name
    if fits(beside) and trusted_library(beside, me | {0}, symbols):
        return beside
    cache = private_cache()
    if cache is not None and fits(cache / name):
        if trusted_library(cache / name, me, symbols):
            return cache / name
        try:
            return _compile_into(cache, name, source, flags, libs, what, symbols)
        except OSError:
            pass  # a read-only or full cache: a private folder of its own
    try:
        folder = Path(tempfile.mkdtemp(prefix="alloctrace-lib-"))
    except OSError as e:
        raise UserError(f"cannot build {what}: no private folder to build it in ({e.strerror}); "
                        "make ~/.cache or $TMPDIR writable") from None
    atexit.register(shutil.rmtree, folder, True)
    if not fits(folder / name):
        raise UserError(f"cannot preload {what} from {folder}: its path holds a space or a colon, which "
                        "LD_PRELOAD splits; set TMPDIR (or XDG_CACHE_HOME) to a path without them")
    try:
        return _compile_into(folder, name, source, flags, libs, what, symbols)
    except OSError as e:
        raise UserError(f"cannot build {what} in {folder}: {e.strerror}") from None


def private_cache() -> Path | None:
    """~/.cache/alloctrace (or $XDG_CACHE_HOME's), made when missing; None when it cannot be made or is
    not a folder of this user's that only this user can write."""
    d = cache_dir()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return d if private_dir(d, frozenset({os.getuid()})) and os.access(d, os.W_OK | os.X_OK) else None


def _compile_into(folder: Path, name: str, source: Path, flags, libs, what: str, symbols) -> Path:
    """Compile into a temporary file of `folder`, check it, then rename it to `name` (atomic: a concurrent
    build of the same source yields the same file). OSError when the folder cannot take it."""
    from alloctrace.traces.errors import UserError

    cc = compiler(what)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        try:
            r = compile_library(cc, source, Path(tmp), flags, libs)
        except OSError as e:
            raise UserError(f"building {what} with {cc} failed: {e}") from None
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            raise UserError(f"building {what} with {cc} failed: {first}")
        os.chmod(tmp, 0o755)
        if not trusted_library(Path(tmp), frozenset({os.getuid()}), symbols):
            raise UserError(f"building {what} with {cc} gave no usable library")
        os.replace(tmp, folder / name)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder / name
