"""The C parts of this package (the fast log reader, the fast replay, the recorder's preload library): built
by setup.py beside their sources at install time (`pip install .` and `pip install -e .` alike, when a C
compiler is there), named by the source's hash and the flags, so a library never outlives its source.

A library is code that will run, so it is opened once and what is checked is what runs: the path is
walked from / one folder at a time (no link followed), every folder on the way owned by root or this user
and writable by no one else (a sticky folder such as /tmp aside: its entries are checked in turn), the file
a regular, non-empty ELF file of root's or this user's that no one else can write and that exports the
symbols it is bound by; then that same open file is loaded (/proc/self/fd/N). There is no per-user cache:
without an install-time library `import` and `replay` read on the pure Python path, and `record`, `sweep`
and `fit` build the recorder into a fresh private folder (mkdtemp) removed when the command ends, or refuse
in one line. docs/limits.md lists these rules.

This module imports nothing of the package at its top: setup.py loads it by path to name what it builds."""
from __future__ import annotations

import atexit
import os
import stat
import sys
from pathlib import Path


SHARED_FLAGS = ["-shared", "-fPIC", "-O2", "-fvisibility=hidden"]  # a plain library loaded with ctypes
RECORDER_FLAGS = SHARED_FLAGS + ["-D_GNU_SOURCE"]
RECORDER_LIBS = ("-ldl", "-lpthread")
# (source in the tree, stem, flags, libraries): built by setup.py beside the source; the recorder without
# --ggml-include needs no header of the program, so its default build is one of them
INSTALL_TIME = [("traces/sources/ggml_log/fastlog.c", "fastlog", SHARED_FLAGS, ()),
                ("traces/sources/record/plans_fast.c", "plans_fast", SHARED_FLAGS, ()),
                ("traces/sources/record/recorder.c", "recorder", RECORDER_FLAGS, RECORDER_LIBS)]
PRELOAD_UNSAFE = " :\t\n"  # the dynamic loader splits LD_PRELOAD at spaces and colons
REINSTALL = "reinstall alloctrace with a C compiler present (e.g. apt install gcc, then pip install .)"
LOADED: dict[str, str] = {}  # stem -> the file a library was loaded from (what --verbose names)
_OPENED: dict = {}  # install-time path -> its ctypes.CDLL, loaded once per process


class Untrusted(Exception):
    """A library that is missing or fails a check: the reason, in words."""


def library_name(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"") -> str:
    """`<stem>-<hash>.so`: the hash of the source, `digest_extra` and the flags."""
    digest = sha256(source.read_bytes())
    digest.update(digest_extra)
    digest.update(" ".join(flags).encode())
    return f"{stem}-{digest.hexdigest()[:16]}.so"


def python_sha256():
    """The SHA-256 constructor of Python's own small module (hashlib's where there is none): importing hashlib
    loads OpenSSL's libcrypto, which costs a short command a few milliseconds. Picked by version, since a
    failed import costs a search of every folder on sys.path."""
    try:
        if sys.version_info >= (3, 12):
            from _sha2 import sha256 as new
        else:
            from _sha256 import sha256 as new
    except ImportError:
        from hashlib import sha256 as new
    return new


def sha256(data: bytes):
    """hashlib.sha256 of `data` (python_sha256's): the same digest."""
    return python_sha256()(data)


def find_compiler() -> str | None:
    """The C compiler to use ($CC, else cc, gcc or clang), None when there is none."""
    import shutil  # here, as tempfile below: an installed library (the usual case) needs neither

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return cc if cc and shutil.which(cc) else None


def compile_library(cc: str, source: Path, out: Path, flags: list[str], libs: tuple = ()):
    """Run the compiler; its CompletedProcess (the library at `out` when it succeeded)."""
    import subprocess  # here: a library built before needs none

    return subprocess.run([cc, *flags, "-o", str(out), str(source), *libs], capture_output=True, text=True)


def trusted_owners() -> frozenset:
    return frozenset({0, os.getuid()})


def _check_folder(fd: int, where: str) -> None:
    st = os.fstat(fd)
    if st.st_uid not in trusted_owners():
        raise Untrusted(f"{where} belongs to uid {st.st_uid}")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise Untrusted(f"{where} is writable by other users")


def open_trusted(path: Path, symbols: tuple = ()) -> int:
    """A read-only descriptor of `path` that passed every check of the module's docstring; Untrusted
    (with the reason) otherwise. Each folder is opened relative to the one before with O_NOFOLLOW, so no
    folder or file can be swapped between a check and the open: the checks are made on what was opened."""
    real = os.path.realpath(path)
    parts = [p for p in real.split("/") if p]
    if not parts:
        raise Untrusted(f"{path} is not a file")
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open("/", dir_flags)
    except OSError as e:
        raise Untrusted(f"cannot open /: {e.strerror}") from None
    try:
        _check_folder(fd, "/")
        for i, part in enumerate(parts[:-1]):
            where = "/" + "/".join(parts[:i + 1])
            try:
                nxt = os.open(part, dir_flags, dir_fd=fd)
            except OSError as e:
                raise Untrusted(f"cannot open {where}: {e.strerror}") from None
            os.close(fd)
            fd = nxt
            _check_folder(fd, where)
        try:
            lib = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            raise Untrusted(f"cannot open {real}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        _check_file(lib, real, symbols)
    except BaseException:
        os.close(lib)
        raise
    return lib


def _check_file(fd: int, real: str, symbols: tuple) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"{real} is not a regular file")
    if st.st_uid not in trusted_owners():
        raise Untrusted(f"{real} belongs to uid {st.st_uid}")
    if st.st_mode & 0o022:
        raise Untrusted(f"{real} is writable by other users")
    if st.st_size == 0 or st.st_size > 64 << 20:
        raise Untrusted(f"{real} has {st.st_size} bytes")
    data = os.pread(fd, st.st_size, 0)
    if data[:4] != b"\x7fELF":
        raise Untrusted(f"{real} is not an ELF file")
    missing = [s for s in symbols if b"\0" + s.encode() + b"\0" not in data]
    if missing:
        raise Untrusted(f"{real} does not export {', '.join(missing)}")


def installed_path(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"") -> Path:
    """Where setup.py puts `source`'s library: beside it, in the package."""
    return source.parent / library_name(source, stem, flags, digest_extra)


def load_installed(source: Path, stem: str, symbols: tuple, flags: list[str] = SHARED_FLAGS):
    """The install-time library of `source` as a ctypes.CDLL, loaded from the descriptor its checks were made
    on; Untrusted (why) when it is missing or fails one. Never compiles anything."""
    import ctypes

    path = installed_path(source, stem, flags)
    if str(path) in _OPENED:
        return _OPENED[str(path)]
    if not os.path.isdir("/proc/self/fd"):
        raise Untrusted("no /proc/self/fd to load a checked library from")
    fd = open_trusted(path, symbols)
    try:
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError as e:
        os.close(fd)
        raise Untrusted(f"cannot load {path}: {e}") from None
    # the descriptor stays open: the loader knows a library by the name it was opened with, and a later
    # /proc/self/fd/N of a reused N would be taken for this one
    LOADED[stem] = os.path.realpath(path)
    _OPENED[str(path)] = lib
    return lib


def check_sizes(lib, function: str, structs: dict) -> None:
    """Each ctypes Structure of `structs` (C name -> class) has the size the library's `function(name)` says
    its C struct has: one side changed without the other fails here, loudly, not in a call."""
    import ctypes

    sizeof = getattr(lib, function)
    sizeof.argtypes, sizeof.restype = [ctypes.c_char_p], ctypes.c_int64
    for name, cls in structs.items():
        c_size = sizeof(name.encode())
        if c_size != ctypes.sizeof(cls):
            raise AssertionError(f"{name} is {c_size} bytes in C but {ctypes.sizeof(cls)} in Python: "
                                 "the C struct and its ctypes mirror differ")


class InstalledLibrary:
    """One install-time library as a fast path sees it: loaded, checked and bound once (`get()`: what `bind`
    made of it, or None), why not (`unavailable()`), and which path runs, in words (`path_line()`). The one
    prologue every compiled fast path shares; ALLOCTRACE_PURE_PYTHON=1 turns them all off."""

    def __init__(self, source: Path, stem: str, symbols: tuple, sizes: tuple[str, dict], bind, what: str,
                 on_untrusted=None):
        self.source, self.stem, self.symbols, self.sizes, self.bind = source, stem, symbols, sizes, bind
        self.what, self.on_untrusted = what, on_untrusted  # on_untrusted(why): a debug line, say
        self._tried: list = []  # [bound library or None], once tried
        self._why: str | None = None

    def get(self):
        if os.environ.get("ALLOCTRACE_PURE_PYTHON") == "1":
            return None
        if not self._tried:
            try:
                lib = load_installed(self.source, self.stem, self.symbols)
            except Untrusted as e:
                self._why, lib = str(e), None
                if self.on_untrusted is not None:
                    self.on_untrusted(self._why)
            if lib is not None:
                check_sizes(lib, *self.sizes)
                lib = self.bind(lib)
            self._tried.append(lib)
        return self._tried[0]

    def unavailable(self) -> str | None:
        if os.environ.get("ALLOCTRACE_PURE_PYTHON") == "1":
            return "ALLOCTRACE_PURE_PYTHON=1"
        return None if self.get() is not None else (self._why or "not loaded")

    def path_line(self) -> str:
        why = self.unavailable()
        if why is None:
            return f"{self.what}: the compiled path, loaded from {LOADED.get(self.stem, 'the package')}"
        return f"{self.what}: the pure Python path ({why})"


def preload_safe(path: Path) -> bool:
    """An absolute path the dynamic loader reads as one entry of LD_PRELOAD."""
    s = str(path)
    return os.path.isabs(s) and not any(c in s for c in PRELOAD_UNSAFE)


_PRELOADS: dict[str, Path] = {}  # library name -> the path handed to LD_PRELOAD (one build per command)


def preload_library(source: Path, stem: str, flags: list[str], digest_extra: bytes = b"", libs: tuple = (),
                    what: str | None = None, symbols: tuple = ()) -> Path:
    """A path for LD_PRELOAD to `source` built with `flags`: the install-time library inside the package,
    else a build into a fresh private folder removed when this process ends; either way checked as
    open_trusted checks it, at a path with no space or colon. UserError (one line, how to fix it) when
    neither is possible."""
    from alloctrace.traces.errors import UserError

    what = what or stem
    name = library_name(source, stem, flags, digest_extra)
    if name in _PRELOADS and _PRELOADS[name].exists():
        return _PRELOADS[name]
    why = "it was not built at install time"
    beside = Path(os.path.realpath(installed_path(source, stem, flags, digest_extra)))
    try:
        os.close(open_trusted(beside, symbols))
        if preload_safe(beside):
            _PRELOADS[name] = beside
            return beside
        why = f"its path {beside} holds a space or a colon, which LD_PRELOAD splits"
    except Untrusted as e:
        if os.path.lexists(beside):
            why = str(e)
    cc = find_compiler()
    if cc is None:
        raise UserError(f"{what} is not usable ({why}) and no C compiler (cc, gcc or clang) is found to build "
                        f"it: {REINSTALL}, or set CC")
    out = _build_private(cc, source, name, flags, libs, what, symbols)
    _PRELOADS[name] = out
    return out


def _build_private(cc: str, source: Path, name: str, flags, libs, what: str, symbols) -> Path:
    """`source` compiled into a fresh private folder (mkdtemp, removed at exit), checked as any library."""
    import shutil
    import tempfile

    from alloctrace.traces.errors import UserError

    try:
        folder = Path(os.path.realpath(tempfile.mkdtemp(prefix="alloctrace-lib-")))
    except OSError as e:
        raise UserError(f"cannot build {what}: no private folder to build it in ({e.strerror}); "
                        f"make $TMPDIR writable, or {REINSTALL}") from None
    atexit.register(shutil.rmtree, folder, True)
    out = folder / name
    if not preload_safe(out):
        raise UserError(f"cannot preload {what} from {folder}: its path holds a space or a colon, which "
                        f"LD_PRELOAD splits; set TMPDIR to a path without them, or {REINSTALL}")
    try:
        r = compile_library(cc, source, out, flags, libs)
    except OSError as e:
        raise UserError(f"building {what} with {cc} failed: {e}") from None
    if r.returncode != 0:
        first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
        raise UserError(f"building {what} with {cc} failed: {first}")
    try:
        os.chmod(out, 0o755)
        os.close(open_trusted(out, symbols))
    except (OSError, Untrusted) as e:
        raise UserError(f"building {what} with {cc} gave no usable library ({e})") from None
    return out
