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
    for it; without a compiler, or when one fails, nothing is lost: the package builds it on first use."""

    def run(self):
        super().run()
        cbuild = _cbuild()
        cc = cbuild.find_compiler()
        for rel, stem, flags, libs in cbuild.INSTALL_TIME:
            source = HERE / rel
            top, rest = rel.split("/", 1)
            target = Path(self.build_lib) / "alloctrace" / top / rest
            out = target.parent / cbuild.library_name(source, stem, flags)
            if not cc or self.dry_run:
                print(f"no C compiler: {rel} will be built on first use")
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            r = cbuild.compile_library(cc, source, out, flags, libs)
            if r.returncode != 0:
                print(f"building {rel} failed (it will be built on first use): {r.stderr.strip()[:300]}")
                if out.exists():
                    out.unlink()


setup(packages=discover(), cmdclass={"build_py": BuildPyWithLibraries})
