"""Package discovery for the folder layout: each top-level folder is a sub-package of `alloctrace`.

pyproject.toml's `package-dir` maps `alloctrace.allocator` to `allocator/` and so on; setuptools' own
discovery cannot add a prefix, so this finds every package under each mapped folder (and under
`alloctrace/`) and names it inside the namespace. A new sub-package needs no list to be kept by hand.
"""
import tomllib
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
PACKAGE_DIR = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def discover() -> list[str]:
    found = find_packages(where=str(HERE), include=["alloctrace", "alloctrace.*"])
    for name, folder in PACKAGE_DIR.items():
        found.append(name)  # a data-only folder (web/) is a package too, so its files ship
        found += [f"{name}.{sub}" for sub in find_packages(where=str(HERE / folder), exclude=["tests", "tests.*"])]
    return sorted(set(found))


setup(packages=discover())
