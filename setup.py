"""Package discovery for the folder layout (each top-level folder is a sub-package of `alloctrace`), and the
C fast paths compiled at install time when a C compiler is there.

pyproject.toml's `package-dir` maps `alloctrace.allocator` to `allocator/` and so on; setuptools' own
discovery cannot add a prefix, so this finds every package under each mapped folder (and under
`alloctrace/`) and names it inside the namespace. A new sub-package needs no list to be kept by hand.
"""
import importlib.util
import tomllib
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def discover() -> list[str]:
    found = find_packages(where=str(HERE), include=["alloctrace", "alloctrace.*"])
    for name, folder in PACKAGE_DIR.items():
        found.append(name)  # a data-only folder (web/) is a package too, so its files ship
        found += [f"{name}.{sub}" for sub in find_packages(where=str(HERE / folder), exclude=["tests", "tests.*"])]
    return sorted(set(found))


def _cbuild():
    """traces/util/cbuild.py, loaded by path (it imports nothing of the package at its top)."""
    spec = importlib.util.spec_from_file_location("_alloctrace_cbuild", HERE / "traces" / "util" / "cbuild.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithLibraries(build_py):
    """Also compiles each of cbuild.INSTALL_TIME beside its source in the package, named as the package looks
    for it: in the wheel (`pip install .`), or beside the source in this tree for an editable install
    (`pip install -e .`, whose package is this tree; the libraries are ignored by git). Without a compiler,
    or when one fails, the package still installs: import and replay read on the Python path, record
    builds its recorder into a private folder each time (or says how to fix the install)."""

    def run(self):
        super().run()
        cbuild = _cbuild()
        cc = cbuild.find_compiler()
        editable = getattr(self, "editable_mode", False)
        for rel, stem, flags, libs in cbuild.INSTALL_TIME:
            source = HERE / rel
            top, rest = rel.split("/", 1)
            target = source if editable else Path(self.build_lib) / "alloctrace" / top / rest
            out = target.parent / cbuild.library_name(source, stem, flags)
            if not cc or self.dry_run:
                print(f"no C compiler: {rel} is not built (the package runs without it)")
                continue
            if editable:  # an earlier build of an older source
                for old in target.parent.glob(f"{stem}-*.so"):
                    if old != out:
                        old.unlink()
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.part")
            r = cbuild.compile_library(cc, source, tmp, flags, libs)
            if r.returncode != 0:
                print(f"building {rel} failed (the package runs without it): {r.stderr.strip()[:300]}")
                tmp.unlink(missing_ok=True)
                continue
            tmp.chmod(0o755)
            tmp.replace(out)


setup(packages=discover(), cmdclass={"build_py": BuildPyWithLibraries})
